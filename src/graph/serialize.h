// Graph ↔ JSON, for plans. Weights are not embedded: the writer maps each weight value to a blob
// index and the reader asks the plan to bind a blob (its tensor and layout) to a weight value.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "graph/ir.h"

namespace kiln {

nlohmann::json graph_to_json(const Graph& graph, const std::function<int(const Value&)>& blob_of);
// Validates structure (ids in range, known ops and dtypes) and runs verify_graph; errors name
// `source` and the field.
Graph graph_from_json(const nlohmann::json& j,
                      const std::function<void(int blob, Value& weight)>& bind_blob,
                      const std::string& source);

}  // namespace kiln
