// Leveled logging owned by a Context (no global logger). INFO says what a step did (which
// fusions fired, memory); DEBUG is for --verbose detail.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln {

enum class LogLevel : uint8_t { kDebug, kInfo, kWarning, kError, kSilent };

// Writes `text` to `sink` (a log or standard error) and flushes it, ignoring failure: a log line,
// a progress line or an error message that cannot be written (standard error closed, on a full
// disk, or a pipe whose reader went away: `2>&1 | grep -q`) must never stop or change the outcome
// of the work it reports on. Standard output is not written this way (tools/kiln/output.h).
void write_best_effort(FILE* sink, std::string_view text);

class StatusLine;

class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kWarning, FILE* sink = stderr)
      : level_(level), sink_(sink) {}
  LogLevel level() const { return level_; }
  void set_level(LogLevel level) { level_ = level; }
  bool enabled(LogLevel level) const { return level >= level_; }
  FILE* sink() const { return sink_; }

  void write(LogLevel level, std::string_view message) const;
  template <typename... Args>
  void debug(fmt::format_string<Args...> f, Args&&... args) const {
    if (enabled(LogLevel::kDebug))
      write(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void info(fmt::format_string<Args...> f, Args&&... args) const {
    if (enabled(LogLevel::kInfo))
      write(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void warn(fmt::format_string<Args...> f, Args&&... args) const {
    if (enabled(LogLevel::kWarning))
      write(LogLevel::kWarning, fmt::format(f, std::forward<Args>(args)...));
  }

  // The status line drawn below the log on a terminal (at most one); log lines are written
  // above it. Set and cleared by StatusLine itself.
  void set_status_line(StatusLine* line) const { status_ = line; }

 private:
  LogLevel level_;
  FILE* sink_;
  // Not part of the logger's state: which line to keep at the bottom while writing.
  mutable StatusLine* status_ = nullptr;
};

// A line redrawn in place at the bottom of a terminal. Drawn only when the logger's sink is a
// terminal and warnings are shown (not with -q); never on a pipe or file. A background thread
// redraws it every 250 ms, so a step that reports nothing still shows its elapsed time.
class StatusLine {
 public:
  explicit StatusLine(const Logger& log);
  virtual ~StatusLine();
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;

  // Erases the line until show() (for writing something else to the terminal).
  void hide();
  void show();
  double elapsed_seconds() const;

 protected:
  // The text to draw; called with mu_ held (from the ticker thread too).
  virtual std::string render() const = 0;
  // Derived constructors call start() once they can render(), and their destructors stop()
  // (idempotent: joins the ticker and erases the line) before their members go away.
  void start();
  void stop();
  // Redraws now; callers hold mu_ (they changed what render() returns).
  void redraw_locked();
  const Logger& log_;
  mutable std::mutex mu_;

 private:
  void draw_locked();
  void erase_locked();

  struct Ticker;
  std::unique_ptr<Ticker> ticker_;
  bool tty_;
  bool drawn_ = false;
  bool stopped_ = false;
  int hidden_ = 0;
  int64_t start_ns_;
  int64_t last_draw_ns_ = 0;
};

// Progress of a step with a known amount of work ("generating: 12/40 prompts, 3.1/s").
// done() logs at INFO what was done and how fast, whether or not a terminal showed it.
class Progress : public StatusLine {
 public:
  Progress(const Logger& log, std::string label, int64_t total, std::string unit = "steps");
  ~Progress() override;
  void advance(int64_t n = 1);
  // A short note drawn after the count (e.g. eval's running accuracy).
  void set_note(std::string note);
  // Logs "label: <summary>" at INFO (default summary: "N unit in S s (R unit/s)").
  void done(const std::string& summary = "");

 protected:
  std::string render() const override;

 private:
  std::string label_;
  std::string unit_;
  int64_t total_;
  int64_t current_ = 0;
  std::string note_;
  bool finished_ = false;
};

// A step whose amount of work is unknown ("building models/t5-tiny ... 2.3 s").
class Activity : public StatusLine {
 public:
  Activity(const Logger& log, std::string label);
  ~Activity() override;

 protected:
  std::string render() const override;

 private:
  std::string label_;
};

}  // namespace kiln
