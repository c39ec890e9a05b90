// Standard output of every subcommand. Each line is written and flushed at once so that a failed
// write is seen where it happens: a closed pipe (`kiln run ... | head -1`) throws StdoutClosed,
// which ends the command quietly with exit 0; any other failure (`> /dev/full`) is a runtime
// error naming standard output (exit 1). Standard error (errors, logs, progress) is written with
// err(), whose failures are ignored: the exit code never depends on whether a message could be
// shown (`2>/dev/full`, `2>&1 | grep -q`).
#pragma once

#include <fmt/format.h>

#include <cstdio>

#include <string_view>

namespace kiln::cli {

struct StdoutClosed {};

// SIGPIPE would kill the process at the first write to a closed pipe, SIGXFSZ at a write past
// the file size limit (leaving a half-written plan behind); with them ignored, such writes fail
// with EPIPE / EFBIG and are reported like any other failed write.
void ignore_write_signals();
void out_text(std::string_view text);
inline void out_line(std::string_view line) { out_text(std::string(line) + "\n"); }
template <typename... Args>
void out(fmt::format_string<Args...> f, Args&&... args) {
  out_text(fmt::format(f, std::forward<Args>(args)...));
}
// To standard error, ignoring a failed write (kiln::write_best_effort).
void err_text(std::string_view text);
template <typename... Args>
void err(fmt::format_string<Args...> f, Args&&... args) {
  err_text(fmt::format(f, std::forward<Args>(args)...));
}
// Checks what CLI11 wrote through std::cout (--help); same errors as out_text.
void check_cout();

}  // namespace kiln::cli
