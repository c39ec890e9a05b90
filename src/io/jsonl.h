// JSON lines files (prompts, datasets, id lists): one reader for every subcommand. Blank lines
// are skipped; every error names the file and the line.
#pragma once

#include <functional>
#include <istream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kiln {

using JsonlRowFn = std::function<void(const nlohmann::json& value, int line)>;

// Calls `fn(value, line_number)` for each non-blank line. A missing or unreadable file, or a
// directory, is an error naming the path (kNotFound / kRuntime); a line that is not JSON is an
// error naming path:line (and the byte offset when the line is not valid UTF-8). `fn` may
// throw; its kiln::Error messages should name the line too.
void read_jsonl(const std::string& path, const JsonlRowFn& fn);
// The same from an open stream (standard input); `name` stands for the path in errors.
void read_jsonl(std::istream& in, const std::string& name, const JsonlRowFn& fn);

// Offset of the first byte of `text` that does not belong to a valid UTF-8 sequence (overlong
// forms, surrogates and code points beyond U+10FFFF are invalid), or npos when all of it is valid.
size_t invalid_utf8_offset(std::string_view text);

}  // namespace kiln
