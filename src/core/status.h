// Errors: KILN_CHECK records file:line and a formatted message and throws kiln::Error.
// Library code never aborts or exits; the CLI and server map Error::kind() to exit codes and
// HTTP statuses. what() is the message alone (what a user reads); where() is the source location
// (for bug reports: `kiln -v` prints it).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdexcept>
#include <string>

namespace kiln {

enum class ErrorKind {
  kRuntime,   // bad file, bad data, failed kernel: exit code 1
  kUsage,     // the caller asked for something invalid (bad flag value, oversized request): 2
  kNotFound,  // a file or model that does not exist: 1
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, const char* file, int line)
      : std::runtime_error(std::move(message)), kind_(kind), file_(file), line_(line) {}
  ErrorKind kind() const { return kind_; }
  const char* file() const { return file_; }
  int line() const { return line_; }
  // "src/dir/file.cc:123": the path from src/ (or tools/), so messages do not leak the build
  // machine's layout.
  std::string where() const;

 private:
  ErrorKind kind_;
  const char* file_;
  int line_;
};

[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, std::string message);

}  // namespace kiln

#define KILN_FAIL_KIND(kind, ...) \
  ::kiln::throw_error(kind, __FILE__, __LINE__, fmt::format(__VA_ARGS__))
#define KILN_FAIL(...) KILN_FAIL_KIND(::kiln::ErrorKind::kRuntime, __VA_ARGS__)
#define KILN_CHECK(cond, ...) \
  do {                        \
    if (!(cond)) [[unlikely]] \
      KILN_FAIL(__VA_ARGS__); \
  } while (0)
#define KILN_CHECK_USAGE(cond, ...)                           \
  do {                                                        \
    if (!(cond)) [[unlikely]]                                 \
      KILN_FAIL_KIND(::kiln::ErrorKind::kUsage, __VA_ARGS__); \
  } while (0)
