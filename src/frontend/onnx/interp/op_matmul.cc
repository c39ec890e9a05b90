// Matrix products: MatMul (numpy's matmul: 1-d operands get a dimension added and removed again,
// batch dimensions broadcast) and Gemm (2-d, transposes, alpha/beta, C broadcast to [M, N]).
// Rows accumulate in the operands' type, k outermost so that the inner loop runs over
// contiguous output and B elements.
#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

// c[m, n] += sum_k a[m * a_row + k * a_col] * b[k * b_row + n]  (b's rows contiguous)
template <typename T>
void matmul_2d(const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t b_row, T* c, int64_t m,
               int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    T* out = c + i * n;
    for (int64_t p = 0; p < k; ++p) {
      const T av = a[i * a_row + p * a_col];
      const T* brow = b + p * b_row;
      for (int64_t j = 0; j < n; ++j) out[j] = wrap_add(out[j], wrap_mul(av, brow[j]));
    }
  }
}

// f * v in T (integers through float_to_int: no undefined conversions).
template <typename T>
T scaled(float f, T v) {
  if constexpr (std::is_floating_point_v<T>)
    return f * v;
  else
    return float_to_int<T>(static_cast<double>(f) * static_cast<double>(v));
}

}  // namespace

void run_matmul(OpContext& ctx) {
  const OnnxElemType type = ctx.input_type(0);
  KILN_CHECK(ctx.input_type(1) == type, "MatMul needs operands of one type, got {} and {}",
             onnx_elem_type_name(type), onnx_elem_type_name(ctx.input_type(1)));
  Shape a = ctx.input_shape(0), b = ctx.input_shape(1);
  KILN_CHECK(!a.empty() && !b.empty(), "MatMul needs operands of rank 1 or more, got {} and {}",
             shape_str(a), shape_str(b));
  const bool a_vector = a.size() == 1, b_vector = b.size() == 1;
  if (a_vector) a.insert(a.begin(), 1);
  if (b_vector) b.push_back(1);
  const int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
  KILN_CHECK(b[b.size() - 2] == k, "MatMul of {} and {}: the inner dimensions differ ({} vs {})",
             shape_str(ctx.input_shape(0)), shape_str(ctx.input_shape(1)), k, b[b.size() - 2]);
  const Shape a_batch(a.begin(), a.end() - 2), b_batch(b.begin(), b.end() - 2);
  const Shape batch = broadcast_shapes({a_batch, b_batch});
  Shape out = batch;
  if (!a_vector) out.push_back(m);
  if (!b_vector) out.push_back(n);
  ImportTensor& y = ctx.set_output(0, type, out);
  if (ctx.shape_only() || y.numel() == 0) return;
  const ImportTensor &x0 = ctx.input(0), &x1 = ctx.input(1);
  // Offsets of each batch's matrices: the batch shape walked with broadcast strides.
  const std::array<Shape, 2> strides = {broadcast_strides(a_batch, batch),
                                        broadcast_strides(b_batch, batch)};
  visit_numeric(type, "MatMul", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = x0.data<T>();
    const T* pb = x1.data<T>();
    T* pc = y.mutable_data<T>();
    int64_t index = 0;
    for_each_row<2>(batch, strides, [&](int64_t, const auto& off, const auto& step, int64_t len) {
      for (int64_t j = 0; j < len; ++j, ++index)
        matmul_2d(pa + (off[0] + j * step[0]) * m * k, k, 1, pb + (off[1] + j * step[1]) * k * n, n,
                  pc + index * m * n, m, k, n);
    });
  });
}

// Gemm(A, B[, C]): alpha * A' B' + beta * C, A' = transA ? A^T : A (2-d), likewise B'.
void run_gemm(OpContext& ctx) {
  const OnnxElemType type = ctx.input_type(0);
  KILN_CHECK(ctx.input_type(1) == type, "Gemm needs operands of one type, got {} and {}",
             onnx_elem_type_name(type), onnx_elem_type_name(ctx.input_type(1)));
  const Shape &a = ctx.input_shape(0), &b = ctx.input_shape(1);
  KILN_CHECK(a.size() == 2 && b.size() == 2, "Gemm needs 2-d A and B, got {} and {}", shape_str(a),
             shape_str(b));
  const bool ta = ctx.attr_int("transA", 0) != 0, tb = ctx.attr_int("transB", 0) != 0;
  const float alpha = ctx.attr_float("alpha", 1.0f), beta = ctx.attr_float("beta", 1.0f);
  const int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
  const int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  KILN_CHECK(k == kb, "Gemm of {}{} and {}{}: the inner dimensions differ ({} vs {})", shape_str(a),
             ta ? "ᵀ" : "", shape_str(b), tb ? "ᵀ" : "", k, kb);
  const bool has_c = ctx.has_input(2);
  if (has_c) {
    KILN_CHECK(ctx.input_type(2) == type, "Gemm's C is {}, A is {}",
               onnx_elem_type_name(ctx.input_type(2)), onnx_elem_type_name(type));
    const Shape& c = ctx.input_shape(2);
    KILN_CHECK(broadcasts_to(c, {m, n}), "Gemm's C {} does not broadcast to [{}, {}]", shape_str(c),
               m, n);
  }
  ImportTensor& y = ctx.set_output(0, type, {m, n});
  if (ctx.shape_only() || y.numel() == 0) return;
  const ImportTensor &x0 = ctx.input(0), &x1 = ctx.input(1);
  visit_numeric(type, "Gemm", [&](auto tag) {
    using T = decltype(tag);
    T* pc = y.mutable_data<T>();
    // B' with contiguous rows: B itself, or its transpose copied once.
    std::vector<T> bt;
    const T* pb = x1.data<T>();
    if (tb) {
      bt.resize(static_cast<size_t>(k * n));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t p = 0; p < k; ++p) bt[p * n + i] = pb[i * k + p];
      pb = bt.data();
    }
    matmul_2d(x0.data<T>(), ta ? 1 : k, ta ? m : 1, pb, n, pc, m, k, n);
    const int64_t total = m * n;
    if (alpha != 1.0f)
      for (int64_t i = 0; i < total; ++i) pc[i] = scaled(alpha, pc[i]);
    if (!has_c || beta == 0.0f) return;
    const ImportTensor& c = ctx.input(2);
    const T* cc = c.data<T>();
    const std::array<Shape, 1> strides = {broadcast_strides(c.shape(), {m, n})};
    for_each_row<1>(Shape{m, n}, strides,
                    [&](int64_t o, const auto& off, const auto& step, int64_t len) {
                      for (int64_t j = 0; j < len; ++j)
                        pc[o + j] = wrap_add(pc[o + j], scaled(beta, cc[off[0] + j * step[0]]));
                    });
  });
}

}  // namespace kiln
