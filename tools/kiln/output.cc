#include "output.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "core/logging.h"
#include "core/status.h"

namespace kiln::cli {
namespace {

[[noreturn]] void write_failed(int error) {
  if (error == EPIPE) throw StdoutClosed{};
  KILN_FAIL("cannot write to standard output: {}", std::strerror(error));
}

}  // namespace

void ignore_write_signals() {
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
}

void out_text(std::string_view text) {
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    write_failed(errno != 0 ? errno : EIO);
}

void err_text(std::string_view text) { write_best_effort(stderr, text); }

void check_cout() {
  errno = 0;
  std::cout.flush();
  if (!std::cout) write_failed(errno != 0 ? errno : EIO);
}

}  // namespace kiln::cli
