#include "exec_compare.h"

#include <cmath>

namespace kiln::cli {

OutputComparison compare_output(const std::string& name, const ImportTensor& got, const Tensor* ref,
                                double atol, double rtol, const std::optional<CompareMask>& mask) {
  OutputComparison c;
  c.name = name;
  if (ref == nullptr) {
    c.problem = "no reference tensor of this name";
    return c;
  }
  if (ref->shape() != got.shape()) {
    c.problem = fmt::format("the reference is {}, the output {}", shape_str(ref->shape()),
                            shape_str(got.shape()));
    return c;
  }
  if (!dtype_traits(ref->dtype()).to_float) {
    c.problem =
        fmt::format("the reference is {}, which has no float view", dtype_name(ref->dtype()));
    return c;
  }
  const std::vector<float> a = got.to_floats();
  const Tensor r = ref->to_f32();
  const float* b = r.data<float>();
  // Elements per [batch, seq] position when the mask applies.
  int64_t per_position = 0;
  if (mask && got.rank() >= 2 && got.dim(0) == mask->shape[0] && got.dim(1) == mask->shape[1]) {
    c.masked = true;
    per_position = got.numel() / std::max<int64_t>(mask->shape[0] * mask->shape[1], 1);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (c.masked && mask->values[i / per_position] == 0) continue;
    ++c.compared;
    const double x = a[i], y = b[i];
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) ++c.mismatches;
      continue;
    }
    const double diff = x == y ? 0.0 : std::fabs(x - y);  // equal infinities differ by 0
    c.max_abs_ref = std::max(c.max_abs_ref, std::fabs(y));
    c.max_abs_error = std::max(c.max_abs_error, diff);
    if (y != 0) c.max_rel_error = std::max(c.max_rel_error, diff / std::fabs(y));
    if (!(diff <= atol + rtol * std::fabs(y))) ++c.mismatches;
  }
  c.pass = c.mismatches == 0;
  return c;
}

}  // namespace kiln::cli
