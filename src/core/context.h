// What a kiln session owns: logging, the CPU thread pool, and options read once from the
// environment. Everything that would otherwise be a global lives here.
#pragma once

#include <memory>

#include "core/logging.h"
#include "core/thread_pool.h"

namespace kiln {

struct ContextOptions {
  LogLevel log_level = LogLevel::kWarning;
  int threads = 0;  // 0: KILN_NUM_THREADS if set, else one per hardware thread
};

// Reads KILN_NUM_THREADS and KILN_LOG_LEVEL once; explicit options win.
ContextOptions options_from_environment(ContextOptions base = {});

class Context {
 public:
  explicit Context(ContextOptions options = {});
  Logger& log() { return log_; }
  const Logger& log() const { return log_; }
  ThreadPool& pool() { return *pool_; }
  const ContextOptions& options() const { return options_; }

 private:
  ContextOptions options_;
  Logger log_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace kiln
