// Prompts and texts from flags and JSON lines files, with their origin for error messages.
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "io/jsonl.h"

namespace kiln::cli {

std::vector<TextInput> inputs_from_flag(const std::vector<std::string>& values,
                                        const std::string& flag) {
  std::vector<TextInput> out;
  for (size_t i = 0; i < values.size(); ++i)
    out.push_back({values[i], values.size() == 1 ? flag : fmt::format("{} {}", flag, i + 1)});
  return out;
}

std::string input_name(const std::string& path) { return path == "-" ? "<stdin>" : path; }

void read_jsonl_arg(const std::string& path, const char* flag,
                    const std::function<void(const nlohmann::json&, int)>& fn) {
  if (path == "-") {
    read_jsonl(std::cin, input_name(path), fn);
    return;
  }
  KILN_CHECK_USAGE(!path.empty(), "{}: the path is empty (- reads standard input)", flag);
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st))
    KILN_FAIL_KIND(ErrorKind::kNotFound, "{} {}: no such file", flag, path);
  KILN_CHECK(!std::filesystem::is_directory(st),
             "{} {}: this is a directory; expected a JSON lines file", flag, path);
  read_jsonl(path, fn);
}

std::vector<TextInput> read_prompt_lines(const std::string& path, const char* flag) {
  std::vector<TextInput> out;
  const std::string name = input_name(path);
  read_jsonl_arg(path, flag, [&](const nlohmann::json& j, int line) {
    const std::string origin = fmt::format("{}:{}", name, line);
    if (j.is_string()) {
      out.push_back({j.get<std::string>(), origin});
    } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      out.push_back({j["text"].get<std::string>(), origin});
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      out.push_back({j["prompt"].get<std::string>(), origin});
    } else {
      KILN_FAIL_KIND(ErrorKind::kUsage,
                     "{}: expected a JSON string or an object with a \"text\" or \"prompt\" "
                     "string",
                     origin);
    }
  });
  return out;
}

void check_text(const TextInput& input, bool allow_empty) {
  KILN_CHECK_USAGE(allow_empty || !input.text.empty(), "{}: the prompt is empty", input.origin);
  const size_t bad = invalid_utf8_offset(input.text);
  KILN_CHECK_USAGE(bad == std::string::npos,
                   "{}: invalid UTF-8: byte 0x{:02X} at offset {} (kiln reads text as UTF-8)",
                   input.origin, static_cast<unsigned char>(input.text[bad]), bad);
}

}  // namespace kiln::cli
