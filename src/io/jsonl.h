// JSON lines files (prompts, datasets, id lists): one reader for every subcommand. Blank lines
// are skipped; every error names the file and the line.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace kiln {

// Calls `fn(value, line_number)` for each non-blank line. A missing or unreadable file, or a
// directory, is an error naming the path (kNotFound / kRuntime); a line that is not JSON is an
// error naming path:line. `fn` may throw; its kiln::Error messages should name the line too.
void read_jsonl(const std::string& path,
                const std::function<void(const nlohmann::json& value, int line)>& fn);

}  // namespace kiln
