#include "server/request_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>

namespace kiln::server {

namespace {
double ms(Clock::duration d) {
  // Microsecond resolution: enough for any latency and keeps the lines short.
  return std::round(std::chrono::duration<double, std::milli>(d).count() * 1000.0) / 1000.0;
}
}  // namespace

const char* request_end_name(const RequestRecord& r) {
  switch (r.cause) {
    case EndCause::kFinished:
      return finish_reason_name(r.finish_reason);
    case EndCause::kCancelled:
      return "cancelled";
    case EndCause::kQueueTimeout:
    case EndCause::kTimeout:
      return "timeout";
    case EndCause::kError:
    case EndCause::kNone:
      return "error";
  }
  return "error";
}

std::string iso8601_utc_ms(std::chrono::system_clock::time_point t) {
  const auto since = t.time_since_epoch();
  const auto secs = std::chrono::floor<std::chrono::seconds>(since);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since - secs).count();
  const std::time_t tt = static_cast<std::time_t>(secs.count());
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, millis);
}

nlohmann::ordered_json request_log_entry(const std::string& model, int64_t version,
                                         const RequestRecord& r, const std::string& protocol,
                                         std::chrono::system_clock::time_point finished_wall) {
  const bool got_token = r.first_token != Clock::time_point{};
  // The executor's split: queued until the first tokens (or the end, when none came).
  const Clock::time_point started = got_token ? r.first_token : r.finished;
  nlohmann::ordered_json j;
  j["time"] = iso8601_utc_ms(finished_wall);
  j["model"] = model;
  j["version"] = version;
  if (!protocol.empty()) j["protocol"] = protocol;  // unknown where the executor records it
  j["input_tokens"] = r.input_tokens;
  j["output_tokens"] = r.output_tokens;
  j["queue_ms"] = ms(started - r.queued);
  j["ttft_ms"] = got_token ? nlohmann::ordered_json(ms(r.first_token - r.queued)) : nullptr;
  j["total_ms"] = ms(r.finished - r.queued);
  j["finish_reason"] = request_end_name(r);
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

std::unique_ptr<RequestLog> RequestLog::open(const std::string& path, const Logger& log) {
  KILN_CHECK(!path.empty(), "request log: the path is empty");
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    KILN_FAIL("cannot open the request log {}: {}", path, std::strerror(err));
  }
  struct stat st {};
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    KILN_FAIL("cannot open the request log {}: it is a directory", path);
  }
  return std::unique_ptr<RequestLog>(new RequestLog(path, fd, log));
}

RequestLog::RequestLog(std::string path, int fd, const Logger& log)
    : path_(std::move(path)), fd_(fd), log_(log) {}

RequestLog::~RequestLog() { ::close(fd_); }

void RequestLog::write(const std::string& model, int64_t version, const RequestRecord& r,
                       const std::string& protocol) noexcept {
  try {
    // The record's times are on the steady clock; the line says when on the wall clock.
    const auto wall =
        std::chrono::system_clock::now() -
        std::chrono::duration_cast<std::chrono::system_clock::duration>(Clock::now() - r.finished);
    // Invalid UTF-8 in an error message is replaced, not thrown about.
    std::string line = request_log_entry(model, version, r, protocol, wall)
                           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line += '\n';
    std::lock_guard<std::mutex> lock(mutex_);
    const char* p = line.data();
    size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (!warned_) {
          warned_ = true;
          log_.warn("request log {}: cannot write ({}); requests go unlogged until it can", path_,
                    n < 0 ? std::strerror(errno) : "nothing written");
        }
        return;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!warned_) {
      warned_ = true;
      try {
        log_.warn("request log {}: {}", path_, e.what());
      } catch (...) {
      }
    }
  }
}

}  // namespace kiln::server
