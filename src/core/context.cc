#include "core/context.h"

#include <cstdlib>
#include <string>

namespace kiln {

ContextOptions options_from_environment(ContextOptions base) {
  if (base.threads == 0) {
    if (const char* v = std::getenv("KILN_NUM_THREADS")) {
      const int n = std::atoi(v);
      KILN_CHECK_USAGE(n > 0, "KILN_NUM_THREADS must be a positive integer, got '{}'", v);
      base.threads = n;
    }
  }
  if (const char* v = std::getenv("KILN_LOG_LEVEL")) {
    const std::string s = v;
    if (s == "debug")
      base.log_level = LogLevel::kDebug;
    else if (s == "info")
      base.log_level = LogLevel::kInfo;
    else if (s == "warning")
      base.log_level = LogLevel::kWarning;
    else if (s == "error")
      base.log_level = LogLevel::kError;
    else
      KILN_FAIL_KIND(ErrorKind::kUsage, "KILN_LOG_LEVEL must be debug|info|warning|error, got '{}'",
                     s);
  }
  return base;
}

Context::Context(ContextOptions options)
    : options_(options),
      log_(options.log_level),
      pool_(std::make_unique<ThreadPool>(options.threads)) {}

}  // namespace kiln
