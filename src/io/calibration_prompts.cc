#include "io/calibration_prompts.h"

#include "core/status.h"
#include "io/jsonl.h"

namespace kiln {

std::vector<CalibrationPrompt> read_calibration_prompts(const std::string& path) {
  std::vector<CalibrationPrompt> out;
  read_jsonl(path, [&](const nlohmann::json& j, int line) {
    const std::string origin = fmt::format("{}:{}", path, line);
    const nlohmann::json* text = nullptr;
    if (j.is_string()) {
      text = &j;
    } else if (j.is_object()) {
      for (const char* key : {"text", "prompt"})
        if (j.contains(key) && j[key].is_string()) {
          text = &j[key];
          break;
        }
    }
    KILN_CHECK_USAGE(text != nullptr,
                     "{}: expected a JSON string or an object with a \"text\" or \"prompt\" "
                     "string (a calibration prompt)",
                     origin);
    std::string s = text->get<std::string>();
    KILN_CHECK_USAGE(!s.empty(), "{}: the calibration prompt is empty", origin);
    const size_t bad = invalid_utf8_offset(s);
    KILN_CHECK_USAGE(bad == std::string::npos, "{}: invalid UTF-8: byte 0x{:02X} at offset {}",
                     origin, static_cast<unsigned char>(s[bad]), bad);
    out.push_back({std::move(s), origin});
  });
  KILN_CHECK_USAGE(!out.empty(), "{}: no calibration prompts (the file is empty or blank)", path);
  return out;
}

}  // namespace kiln
