// Graph ↔ JSON, for plans. Weights are not embedded: the writer maps each weight value to a blob
// index and the reader asks for the tensor of a blob index.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "graph/ir.h"

namespace kiln {

nlohmann::json graph_to_json(const Graph& graph, const std::function<int(const Tensor&)>& blob_of);
// Validates structure (ids in range, known ops and dtypes) and runs verify_graph; errors name
// `source` and the field.
Graph graph_from_json(const nlohmann::json& j, const std::function<Tensor(int)>& tensor_of,
                      const std::string& source);

}  // namespace kiln
