#include "frontend/onnx/interp/kernel_util.h"

namespace kiln {

Shape broadcast_shapes(const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    for (const Shape& s : shapes) {
      if (d + s.size() < rank) continue;  // s has no dimension here (right-aligned)
      const int64_t n = s[d + s.size() - rank];
      if (n == out[d] || n == 1) continue;
      if (out[d] == 1) {
        out[d] = n;
        continue;
      }
      std::vector<std::string> list;
      for (const Shape& x : shapes) list.push_back(shape_str(x));
      KILN_FAIL("shapes {} do not broadcast (dimension {} from the right: {} vs {})",
                fmt::join(list, ", "), rank - d, out[d], n);
    }
  }
  return out;
}

bool broadcasts_to(const Shape& shape, const Shape& target) {
  if (shape.size() > target.size()) return false;
  const size_t lead = target.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && shape[d] != target[lead + d]) return false;
  return true;
}

Shape row_major_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Shape broadcast_strides(const Shape& shape, const Shape& out) {
  KILN_CHECK(shape.size() <= out.size(), "cannot broadcast {} to {}", shape_str(shape),
             shape_str(out));
  const Shape own = row_major_strides(shape);
  Shape strides(out.size(), 0);
  const size_t lead = out.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) {
    KILN_CHECK(shape[d] == out[lead + d] || shape[d] == 1, "cannot broadcast {} to {}",
               shape_str(shape), shape_str(out));
    strides[lead + d] = shape[d] == 1 ? 0 : own[d];
  }
  return strides;
}

}  // namespace kiln
