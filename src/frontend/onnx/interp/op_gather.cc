// Indexing ops: Gather (one axis) and GatherND (index tuples, with batch_dims). Indices may be
// negative (counted from the end); an index out of range is an error naming it.
#include <cstring>

#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

void check_index_type(OnnxElemType type, std::string_view op) {
  KILN_CHECK(type == OnnxElemType::kInt64 || type == OnnxElemType::kInt32,
             "{}'s indices must be int64 or int32, got {}", op, onnx_elem_type_name(type));
}

int64_t checked_index(int64_t i, int64_t dim, std::string_view what) {
  KILN_CHECK(i >= -dim && i < dim, "{} {} is out of range for a dimension of {}", what, i, dim);
  return i < 0 ? i + dim : i;
}

}  // namespace

// Gather(data, indices): data.shape[:axis] + indices.shape + data.shape[axis+1:].
void run_gather(OpContext& ctx) {
  const Shape& data_shape = ctx.input_shape(0);
  const Shape& index_shape = ctx.input_shape(1);
  check_index_type(ctx.input_type(1), "Gather");
  const int rank = static_cast<int>(data_shape.size());
  const int axis = normalize_axis(ctx.attr_int("axis", 0), rank, "Gather axis");
  Shape out(data_shape.begin(), data_shape.begin() + axis);
  out.insert(out.end(), index_shape.begin(), index_shape.end());
  out.insert(out.end(), data_shape.begin() + axis + 1, data_shape.end());
  ImportTensor& y = ctx.set_output(0, ctx.input_type(0), out);
  if (ctx.shape_only()) return;
  const ImportTensor& data = ctx.input(0);
  const std::vector<int64_t> indices = ctx.input(1).to_int64s();
  const int64_t dim = data_shape[axis];
  const int64_t outer = product(data_shape, 0, axis);
  const auto row = product(data_shape, axis + 1, rank) * static_cast<int64_t>(data.element_bytes());
  const auto* src = static_cast<const char*>(data.raw());
  auto* dst = static_cast<char*>(y.mutable_raw());
  std::vector<int64_t> rows(indices.size());
  for (size_t k = 0; k < indices.size(); ++k)
    rows[k] = checked_index(indices[k], dim, "Gather index");
  for (int64_t o = 0; o < outer; ++o)
    for (size_t k = 0; k < rows.size(); ++k)
      std::memcpy(dst + (o * static_cast<int64_t>(rows.size()) + static_cast<int64_t>(k)) * row,
                  src + (o * dim + rows[k]) * row, row);
}

// GatherND(data, indices) with batch_dims b: indices[..., :] are tuples of k = indices.shape[-1]
// indices into data's dimensions b..b+k-1 within each batch; the output is
// indices.shape[:-1] + data.shape[b+k:].
void run_gather_nd(OpContext& ctx) {
  const Shape& ds = ctx.input_shape(0);
  const Shape& is = ctx.input_shape(1);
  check_index_type(ctx.input_type(1), "GatherND");
  const int r = static_cast<int>(ds.size()), q = static_cast<int>(is.size());
  const int64_t b = ctx.attr_int("batch_dims", 0);
  KILN_CHECK(r >= 1 && q >= 1, "GatherND needs data and indices of rank 1 or more, got {} and {}",
             shape_str(ds), shape_str(is));
  KILN_CHECK(b >= 0 && b < std::min(r, q),
             "GatherND's batch_dims {} must be less than both ranks "
             "({} and {})",
             b, r, q);
  for (int d = 0; d < b; ++d)
    KILN_CHECK(ds[d] == is[d], "GatherND batch dimension {} differs: data {} vs indices {}", d,
               shape_str(ds), shape_str(is));
  const int64_t k = is[q - 1];
  KILN_CHECK(k >= 1 && k <= r - b,
             "GatherND's index tuples have {} entries; data {} with {} "
             "batch dims takes 1..{}",
             k, shape_str(ds), b, r - b);
  Shape out(is.begin(), is.end() - 1);
  out.insert(out.end(), ds.begin() + b + k, ds.end());
  ImportTensor& y = ctx.set_output(0, ctx.input_type(0), out);
  if (ctx.shape_only()) return;
  const ImportTensor& data = ctx.input(0);
  const std::vector<int64_t> indices = ctx.input(1).to_int64s();
  const int64_t batches = product(ds, 0, b);
  const int64_t batch_elems = product(ds, b, r);
  const int64_t tuples = product(is, b, q - 1);  // per batch
  const int64_t slice = product(ds, b + k, r);
  const Shape strides = row_major_strides(ds);
  const auto elem = static_cast<int64_t>(data.element_bytes());
  const auto* src = static_cast<const char*>(data.raw());
  auto* dst = static_cast<char*>(y.mutable_raw());
  for (int64_t bi = 0; bi < batches; ++bi)
    for (int64_t t = 0; t < tuples; ++t) {
      const int64_t* tuple = indices.data() + (bi * tuples + t) * k;
      int64_t offset = bi * batch_elems;
      for (int64_t j = 0; j < k; ++j)
        offset += checked_index(tuple[j], ds[b + j], "GatherND index") * strides[b + j];
      std::memcpy(dst + (bi * tuples + t) * slice * elem, src + offset * elem, slice * elem);
    }
}

}  // namespace kiln
