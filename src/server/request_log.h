// The request log (`kiln serve --request-log FILE`): one JSON line per finished request, for
// auditing and offline analysis (tail -f, jq, a log shipper):
//   {"time": "2026-12-04T18:42:08.123Z", "model": "bloom", "version": 1, "protocol": "openai",
//    "input_tokens": 5, "output_tokens": 12, "queue_ms": 0.4, "ttft_ms": 3.1, "total_ms": 20.5,
//    "finish_reason": "length"}
// plus "error" when the request failed. Written from the engine threads (the executor's
// observer), so a write must be short and must never throw.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "core/logging.h"
#include "runtime/generation_executor.h"

namespace kiln::server {

// "stop", "length", "cancelled", "error" or "timeout" (either deadline).
const char* request_end_name(const RequestRecord& r);

// The line's object (without the trailing newline), for `now` = when the request finished on
// the wall clock. Pure: tests check it field by field.
nlohmann::ordered_json request_log_entry(const std::string& model, int64_t version,
                                         const RequestRecord& r, const std::string& protocol,
                                         std::chrono::system_clock::time_point finished_wall);

// ISO-8601 UTC with milliseconds: "2026-12-04T18:42:08.123Z".
std::string iso8601_utc_ms(std::chrono::system_clock::time_point t);

class RequestLog {
 public:
  // Opens (creates, or appends to) `path`. Throws kiln::Error naming the path and the reason.
  // `log` (which must outlive this) gets one warning if writing fails later.
  static std::unique_ptr<RequestLog> open(const std::string& path, const Logger& log);
  ~RequestLog();
  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;

  // Appends one line. Thread-safe; never throws; the line reaches the file before it returns
  // (one write(2) per line, O_APPEND: whole lines even with another writer on the file).
  void write(const std::string& model, int64_t version, const RequestRecord& r,
             const std::string& protocol) noexcept;
  const std::string& path() const { return path_; }

 private:
  RequestLog(std::string path, int fd, const Logger& log);
  std::string path_;
  int fd_;
  const Logger& log_;
  std::mutex mutex_;
  bool warned_ = false;
};

}  // namespace kiln::server
