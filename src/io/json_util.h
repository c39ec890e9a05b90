// Small helpers for JSON read from untrusted files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kiln {

// A short rendering of a JSON value for error messages, bounded in depth and length: dump()
// recurses, and a hostile header may nest millions of levels or hold megabyte strings.
std::string brief_json(const nlohmann::json& v, int depth = 0);

}  // namespace kiln
