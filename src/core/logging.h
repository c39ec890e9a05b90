// Leveled logging owned by a Context (no global logger). INFO says what a step did (which
// fusions fired, memory); DEBUG is for --verbose detail.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln {

enum class LogLevel : uint8_t { kDebug, kInfo, kWarning, kError, kSilent };

class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kWarning, FILE* sink = stderr)
      : level_(level), sink_(sink) {}
  LogLevel level() const { return level_; }
  void set_level(LogLevel level) { level_ = level; }
  bool enabled(LogLevel level) const { return level >= level_; }

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

 private:
  LogLevel level_;
  FILE* sink_;
};

// A progress line for long steps, drawn only when the sink is a terminal; always logs the step
// at INFO when done.
class Progress {
 public:
  Progress(const Logger& log, std::string label, int64_t total);
  ~Progress();
  void advance(int64_t n = 1);
  void done();

 private:
  const Logger& log_;
  std::string label_;
  int64_t total_;
  int64_t current_ = 0;
  bool tty_;
  bool finished_ = false;
  int last_percent_ = -1;
};

}  // namespace kiln
