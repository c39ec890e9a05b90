// The plan header's typed sections as JSON: the model description (with its generation
// defaults), the shape profile and weight layouts. Readers check every field and name `source`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "graph/model_ir.h"

namespace kiln {

nlohmann::json desc_to_json(const ModelDesc& desc);
ModelDesc desc_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json profile_to_json(const ShapeProfile& profile);
ShapeProfile profile_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json layout_to_json(const WeightLayout& layout);
// A blob's layout as recorded; read_plan checks it against the layouts this kiln knows.
WeightLayout layout_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace kiln
