#include "io/json_util.h"

namespace kiln {

using nlohmann::json;

std::string brief_json(const json& v, int depth) {
  constexpr size_t kMaxChars = 80;
  std::string s;
  if (v.is_array() || v.is_object()) {
    const bool array = v.is_array();
    s.push_back(array ? '[' : '{');
    if (!v.empty() && depth >= 2) s += "...";
    size_t shown = 0;
    for (auto it = v.begin(); depth < 2 && it != v.end(); ++it) {
      if (shown > 0) s += ", ";
      if (shown++ == 4 || s.size() > kMaxChars) {
        s += "...";
        break;
      }
      if (!array) s += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ": ";
      s += brief_json(*it, depth + 1);
    }
    s.push_back(array ? ']' : '}');
  } else {
    s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (s.size() > kMaxChars) s = s.substr(0, kMaxChars - 3) + "...";
  return s;
}

}  // namespace kiln
