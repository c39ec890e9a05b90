#include "core/logging.h"

#include <unistd.h>

#include <chrono>
#include <ctime>

namespace kiln {

void Logger::write(LogLevel level, std::string_view message) const {
  const char* tag = "";
  switch (level) {
    case LogLevel::kDebug:
      tag = "D";
      break;
    case LogLevel::kInfo:
      tag = "I";
      break;
    case LogLevel::kWarning:
      tag = "W";
      break;
    case LogLevel::kError:
      tag = "E";
      break;
    case LogLevel::kSilent:
      return;
  }
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[16];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  fmt::print(sink_, "[kiln {} {}] {}\n", tag, stamp, message);
  std::fflush(sink_);
}

Progress::Progress(const Logger& log, std::string label, int64_t total)
    : log_(log), label_(std::move(label)), total_(total), tty_(isatty(STDERR_FILENO) != 0) {
  tty_ = tty_ && log_.level() != LogLevel::kSilent;
}

Progress::~Progress() {
  if (!finished_ && tty_ && current_ > 0) std::fputs("\n", stderr);
}

void Progress::advance(int64_t n) {
  current_ += n;
  if (!tty_ || total_ <= 0) return;
  const int percent = static_cast<int>(100 * current_ / total_);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  fmt::print(stderr, "\r{}: {:3d}% ({}/{})", label_, percent, current_, total_);
  std::fflush(stderr);
}

void Progress::done() {
  if (finished_) return;
  finished_ = true;
  if (tty_ && last_percent_ >= 0) fmt::print(stderr, "\r\033[K");
  log_.info("{}: done ({} steps)", label_, current_);
}

}  // namespace kiln
