#include "io/jsonl.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/status.h"

namespace kiln {

void read_jsonl(const std::string& path,
                const std::function<void(const nlohmann::json& value, int line)>& fn) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    KILN_FAIL_KIND(ErrorKind::kNotFound, "{}: no such file", path);
  KILN_CHECK(!std::filesystem::is_directory(path, ec),
             "{} is a directory; expected a JSON lines file", path);
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot read {}: {}", path, std::strerror(errno));
  std::string text;
  int lineno = 0;
  while (std::getline(in, text)) {
    ++lineno;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      KILN_FAIL_KIND(ErrorKind::kUsage, "{}:{}: not valid JSON: {}", path, lineno,
                     text.size() > 80 ? text.substr(0, 80) + "..." : text);
    }
    fn(value, lineno);
  }
  KILN_CHECK(!in.bad(), "error reading {}", path);
}

}  // namespace kiln
