// `kiln exec --compare`: an output of the ONNX interpreter against a reference tensor (from
// onnxruntime, polygraphy, ...): max absolute and relative error and numpy's allclose test
// |got - ref| <= atol + rtol * |ref| at every compared element.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "frontend/onnx/import_tensor.h"

namespace kiln::cli {

// Positions to compare: where `mask` ([batch, seq], nonzero = compare) is set, for outputs whose
// first two dimensions are [batch, seq]; other outputs are compared whole.
struct CompareMask {
  std::string input;  // the graph input it came from (for the report)
  Shape shape;        // [batch, seq]
  std::vector<int64_t> values;
};

struct OutputComparison {
  std::string name;
  std::string problem;   // why it could not be compared (no reference, other shape); "" if compared
  int64_t compared = 0;  // elements compared
  bool masked = false;   // the mask applied to this output
  double max_abs_error = 0;
  double max_rel_error = 0;  // |got - ref| / |ref| over elements where ref != 0
  double max_abs_ref = 0;
  int64_t mismatches = 0;  // elements outside atol + rtol * |ref| (NaN against a number counts)
  bool pass = false;
};

OutputComparison compare_output(const std::string& name, const ImportTensor& got, const Tensor* ref,
                                double atol, double rtol, const std::optional<CompareMask>& mask);

}  // namespace kiln::cli
