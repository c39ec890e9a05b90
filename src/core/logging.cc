#include "core/logging.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <thread>

namespace kiln {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string format_rate(double per_second) {
  return per_second >= 10 ? fmt::format("{:.0f}", per_second) : fmt::format("{:.1f}", per_second);
}

}  // namespace

void write_best_effort(FILE* sink, std::string_view text) {
  if (sink == nullptr) return;
  // Not fmt::print, which throws std::system_error on a failed write.
  std::fwrite(text.data(), 1, text.size(), sink);
  std::fflush(sink);
  std::clearerr(sink);
}

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
  StatusLine* status = status_;
  if (status != nullptr) status->hide();
  write_best_effort(sink_, fmt::format("[kiln {} {}] {}\n", tag, stamp, message));
  if (status != nullptr) status->show();
}

struct StatusLine::Ticker {
  std::condition_variable wake;
  std::thread thread;
};

StatusLine::StatusLine(const Logger& log) : log_(log), start_ns_(now_ns()) {
  FILE* sink = log.sink();
  tty_ = sink != nullptr && isatty(fileno(sink)) != 0 && log.enabled(LogLevel::kWarning);
}

StatusLine::~StatusLine() { stop(); }

void StatusLine::start() {
  if (!tty_ || ticker_) return;
  log_.set_status_line(this);
  ticker_ = std::make_unique<Ticker>();
  ticker_->thread = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      ticker_->wake.wait_for(lock, std::chrono::milliseconds(250));
      if (!stopped_) draw_locked();
    }
  });
}

void StatusLine::stop() {
  if (!ticker_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    erase_locked();
  }
  ticker_->wake.notify_all();
  ticker_->thread.join();
  log_.set_status_line(nullptr);
}

void StatusLine::hide() {
  if (!tty_) return;
  std::lock_guard<std::mutex> lock(mu_);
  ++hidden_;
  erase_locked();
}

void StatusLine::show() {
  if (!tty_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (hidden_ > 0) --hidden_;
  redraw_locked();
}

double StatusLine::elapsed_seconds() const {
  return static_cast<double>(now_ns() - start_ns_) * 1e-9;
}

void StatusLine::redraw_locked() {
  // At most 10 redraws a second: a terminal is slower than a fast loop.
  if (now_ns() - last_draw_ns_ >= 100'000'000) draw_locked();
}

void StatusLine::draw_locked() {
  if (!tty_ || !ticker_ || stopped_ || hidden_ > 0) return;
  std::string text = render();
  winsize ws{};
  const int fd = fileno(log_.sink());
  const size_t width = ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col - 1 : 79;
  if (text.size() > width) text.resize(width);
  write_best_effort(log_.sink(), "\r\033[K" + text);
  drawn_ = true;
  last_draw_ns_ = now_ns();
}

void StatusLine::erase_locked() {
  if (!drawn_) return;
  write_best_effort(log_.sink(), "\r\033[K");
  drawn_ = false;
}

Progress::Progress(const Logger& log, std::string label, int64_t total, std::string unit)
    : StatusLine(log), label_(std::move(label)), unit_(std::move(unit)), total_(total) {
  start();
}

Progress::~Progress() { stop(); }

void Progress::advance(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  current_ += n;
  redraw_locked();
}

void Progress::set_note(std::string note) {
  std::lock_guard<std::mutex> lock(mu_);
  note_ = std::move(note);
}

std::string Progress::render() const {
  const double secs = elapsed_seconds();
  std::string text = fmt::format("{}: {}/{} {}", label_, current_, total_, unit_);
  if (total_ > 0) text += fmt::format(" ({}%)", 100 * current_ / total_);
  if (current_ > 0 && secs > 0) text += fmt::format(", {}/s", format_rate(current_ / secs));
  text += fmt::format(", {:.1f} s", secs);
  if (!note_.empty()) text += ", " + note_;
  return text;
}

void Progress::done(const std::string& summary) {
  if (finished_) return;
  finished_ = true;
  stop();
  const double secs = elapsed_seconds();
  if (!summary.empty()) {
    log_.info("{}: {}", label_, summary);
    return;
  }
  log_.info("{}: {} {} in {:.2f} s ({} {}/s)", label_, current_, unit_, secs,
            format_rate(secs > 0 ? static_cast<double>(current_) / secs : 0.0), unit_);
}

Activity::Activity(const Logger& log, std::string label)
    : StatusLine(log), label_(std::move(label)) {
  start();
}

Activity::~Activity() { stop(); }

std::string Activity::render() const {
  return fmt::format("{} ... {:.1f} s", label_, elapsed_seconds());
}

}  // namespace kiln
