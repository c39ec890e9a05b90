#include "io/jsonl.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/status.h"

namespace kiln {

size_t invalid_utf8_offset(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

void read_jsonl(std::istream& in, const std::string& name, const JsonlRowFn& fn) {
  std::string text;
  int lineno = 0;
  while (std::getline(in, text)) {
    ++lineno;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      const size_t bad = invalid_utf8_offset(text);
      KILN_CHECK_USAGE(bad == std::string::npos,
                       "{}:{}: invalid UTF-8: byte 0x{:02X} at offset {} of the line", name, lineno,
                       static_cast<unsigned char>(text[bad]), bad);
      KILN_FAIL_KIND(ErrorKind::kUsage, "{}:{}: not valid JSON: {}", name, lineno,
                     text.size() > 80 ? text.substr(0, 80) + "..." : text);
    }
    fn(value, lineno);
  }
  KILN_CHECK(!in.bad(), "cannot read {} (after line {}): {}", name, lineno, std::strerror(errno));
}

void read_jsonl(const std::string& path, const JsonlRowFn& fn) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    KILN_FAIL_KIND(ErrorKind::kNotFound, "{}: no such file", path);
  KILN_CHECK(!std::filesystem::is_directory(path, ec),
             "{} is a directory; expected a JSON lines file", path);
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot read {}: {}", path, std::strerror(errno));
  read_jsonl(in, path, fn);
}

}  // namespace kiln
