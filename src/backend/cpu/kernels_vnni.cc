// The int8-weight Linear in AVX512-VNNI dot products (vpdpbusd: four u8 × s8 products summed
// into each s32 lane) over the same panel16-packed i8 weights the f32 kernel reads, so a plan
// packed for avx512 runs either way and the choice is the context's (cpu_int8_dot).
//
// Activations are quantized on the fly, each row in groups of kActGroup = 128 elements: a group's
// scale a = max|x| / 127 over the group, q = x · (127 / max|x|) rounded to nearest even (s8).
// vpdpbusd multiplies unsigned by signed bytes, so the weights take the unsigned side as
// u = w + 128 (one xor per line, in registers) and each group's sum carries 128 · Σ q, which the
// quantization records per group and the tile takes off before scaling:
//   y[t][o] = Σ_g f32(Σ_{i∈g} q[t][i] · u[o][i] − 128 · Σ_{i∈g} q[t][i]) · a[t][g]
//             · scale[o] + bias[o],
// each group's integer part exact (|Σ| <= 128 · 127 · 255 < 2^24, so its f32 conversion too).
// Groups rather than one scale a row: at real size (synthesized flan-t5-base, last-token logits
// against fp32, test_real_size_accuracy.cc) one scale a row gave cosine 0.99906 against 0.99982
// for the f32 FMAs; groups of 64 gave 0.99959 (bloom-560m 0.99982, f32 FMAs 0.99993), of 128
// 0.99947 (0.99981), of 256 0.99943 (0.99981). Each group ends in a conversion and a multiply-add
// per accumulator: in kiln_linear_bench's 78-row flan-t5-base shapes groups of 128 took 8 %
// less time than groups of 64 (256: 10 %), 3 interleaved rounds.
//
// Why: batched decode of int8-weight plans was compute-bound in f32 FMAs (each i8 weight widened
// to f32, then one FMA per row): a 16-row bloom-560m step took 73-84 ms against ~12 ms at batch
// 1. One vpdpbusd does 64 multiply-adds where an FMA does 16.
//
// Where: calls of two or more rows (batched decode, prefill); a call of one row (batch-1 decode)
// keeps the f32 FMAs, which measured ~10 % faster there end to end (kMinRows below).
//
// Batch invariance: a row's groups depend on that row alone, and each output sums its groups in
// order, so a row's result is bit-identical in any call of two or more rows, in any tile, on any
// thread; alone (one row) it takes the f32 FMAs and differs in the last digits of the int8
// activation rounding.
//
// W8A8 (--precision int8: an input scale, graph/linear.h) runs the same tiles with one static
// scale for the whole input, calibrated at build time: each row quantized by the definition
// (quantize_input), its integer sums taken over whole rows (groups of kStaticGroup elements, one
// for every model here) and dequantized once in the epilogue, f32(Σ) · s · scale[o] + bias[o].
// Every row count, a single row included, takes these tiles (W8a8VnniLinear), so a row's result
// is bitwise the same alone and in any batch.
//
// Layout: a panel16 line of an i8 panel holds elements i .. i+3 (i a multiple of 4) of its 16
// outputs, byte 16u + j = w[o0 + j][i + u]; vpdpbusd wants output j's four bytes side by side in
// lane j (byte 4j + u). One vpermb (AVX512-VBMI) per line reorders it in registers, as the bf16
// dot products reorder their pairs.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/packed_linear.h"
#include "graph/packing.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as
// "(maybe) uninitialized" once they inline here (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::cpu {
namespace {

using namespace packed;

#define KILN_TARGET_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))

// Byte 4j + u of the result takes byte 16u + j of a panel16 line (see the layout above).
KILN_TARGET_AVX512_VNNI inline __m512i quad_permutation() {
  alignas(64) static constexpr uint8_t kIndex[64] = {
      0,  16, 32, 48, 1,  17, 33, 49, 2,  18, 34, 50, 3,  19, 35, 51, 4,  20, 36, 52, 5,  21,
      37, 53, 6,  22, 38, 54, 7,  23, 39, 55, 8,  24, 40, 56, 9,  25, 41, 57, 10, 26, 42, 58,
      11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
  return _mm512_load_si512(kIndex);
}

// One quad of input elements (4·iq .. 4·iq + 3): P weight lines, each dotted with T broadcast
// activation quads. `bytes` masks the line: all of it, or the 16·(k mod 4) bytes of a partial
// last quad (the rest loads as zero, and meets zero activations). `flip` (0x80 in every byte)
// makes the weights unsigned: u = w + 128.
template <int T, int P>
KILN_TARGET_AVX512_VNNI __attribute__((always_inline)) inline void quad_step(
    __m512i (&acc)[T][P], const uint32_t* x, int64_t ldx, const int8_t* w, int64_t panel,
    int64_t iq, __m512i perm, __m512i flip, __mmask64 bytes) {
  __m512i wv[P];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
    wv[p] = _mm512_xor_si512(
        _mm512_permutexvar_epi8(
            perm, _mm512_maskz_loadu_epi8(bytes, w + p * panel + iq * 4 * kPanelRows)),
        flip);
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m512i xb = _mm512_set1_epi32(static_cast<int>(x[iq * ldx + t]));
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_dpbusd_epi32(acc[t][p], wv[p], xb);
  }
}

constexpr int64_t kGroupQuads = kActGroup / 4;
// W8A8 (one static scale for every element): the integer sums run over whole rows, converted to
// f32 once per kStaticGroup elements so that no int32 lane overflows: a lane adds at most
// kStaticGroup products of |q| <= 127 and u <= 255 (1.06e9 < 2^31). Rows up to that long (every
// model here) are one group: y = f32(Σ q · w) · s · scale[o] + bias[o], exactly the definition
// (graph/linear.h).
constexpr int64_t kStaticGroup = 32768;
constexpr int64_t kStaticGroupQuads = kStaticGroup / 4;

// A group's integer sums into the f32 sums: the shift taken off, × the group's scale.
template <int T, int P>
KILN_TARGET_AVX512_VNNI __attribute__((always_inline)) inline void add_group(
    __m512 (&sum)[T][P], const __m512i (&acc)[T][P], const Epilogue& e, int64_t g) {
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const GroupQuant& q = e.groups[t * e.groups_per_row + g];
    const __m512i shift = _mm512_set1_epi32(q.shift);
    const __m512 a = _mm512_set1_ps(q.scale);
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p)
      sum[t][p] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t][p], shift)), a, sum[t][p]);
  }
}

// Rows [0, T) of x as interleaved quads (quad iq of row t at x[iq·ldx + t]) × P full panels
// starting at output o. k need not be a multiple of 4: the last, partial line is loaded with its
// missing elements zero.
template <int T, int P, int64_t GroupQuads>
KILN_TARGET_AVX512_VNNI void tile_quads(const uint32_t* x, int64_t ldx, const int8_t* w,
                                        const int8_t* next, int64_t k, int64_t o,
                                        const Epilogue& e) {
  __m512 sum[T][P];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) sum[t][p] = _mm512_setzero_ps();
  const __m512i perm = quad_permutation(), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t panel = kPanelRows * k, quads = k / 4, steps = (k + 3) / 4;
  const __mmask64 last =
      _cvtu64_mask64(k % 4 == 0 ? ~uint64_t{0} : (uint64_t{1} << (16 * (k % 4))) - 1);
  // A quad step reads one line of each panel: the prefetches run ahead, then on into the next
  // group of panels (as the other tiles do), or repeat this line without one. Tiles of many rows
  // spend longer on each line and need the longer distance.
  constexpr int64_t kAhead = (T >= 4 ? kDotPrefetchBytes : kPrefetchBytes) / 64;
  for (int64_t g = 0, q0 = 0; q0 < steps; ++g, q0 += GroupQuads) {
    __m512i acc[T][P];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) acc[t][p] = _mm512_setzero_si512();
    const int64_t q1 = std::min(steps, q0 + GroupQuads);
    for (int64_t iq = q0; iq < q1; ++iq) {
      const int8_t* line = line_ahead(w, next, iq, quads, kAhead, 4 * kPanelRows);
      for (int p = 0; p < P; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(line + p * panel), _MM_HINT_T0);
      quad_step<T, P>(acc, x, ldx, w, panel, iq, perm, flip,
                      iq < quads ? _cvtu64_mask64(~uint64_t{0}) : last);
    }
    add_group<T, P>(sum, acc, e, g);
  }
  store_tile<T, P>(sum, o, e);
}

// The last, narrower panel: `width` < 16 outputs stored `width` apart, gathered quad by quad
// into a full line; the same groups and sums per output.
template <int T, int64_t GroupQuads>
KILN_TARGET_AVX512_VNNI void narrow_tile_quads(const uint32_t* x, int64_t ldx, const int8_t* w,
                                               int64_t k, int64_t o, int64_t width,
                                               const Epilogue& e) {
  __m512 sum[T][1];
  for (int t = 0; t < T; ++t) sum[t][0] = _mm512_setzero_ps();
  alignas(64) uint8_t wide[4 * kPanelRows] = {};
  const int64_t steps = (k + 3) / 4;
  for (int64_t g = 0, q0 = 0; q0 < steps; ++g, q0 += GroupQuads) {
    __m512i acc[T][1];
    for (int t = 0; t < T; ++t) acc[t][0] = _mm512_setzero_si512();
    for (int64_t iq = q0; iq < std::min(steps, q0 + GroupQuads); ++iq) {
      for (int64_t j = 0; j < width; ++j)
        for (int64_t u = 0; u < 4; ++u) {
          const int64_t i = 4 * iq + u;  // past k: a zero weight (u = 128) against q = 0
          wide[4 * j + u] = static_cast<uint8_t>((i < k ? w[i * width + j] : int8_t{0}) + 128);
        }
      const __m512i wv = _mm512_load_si512(wide);
      for (int t = 0; t < T; ++t)
        acc[t][0] = _mm512_dpbusd_epi32(acc[t][0], wv,
                                        _mm512_set1_epi32(static_cast<int>(x[iq * ldx + t])));
    }
    add_group<T, 1>(sum, acc, e, g);
  }
  __m512 out[T];
  for (int t = 0; t < T; ++t) out[t] = sum[t][0];
  store_narrow<T>(out, o, width, e);
}

// Rows [0, rows) of x [rows, k] quantized with the static scale s (graph/linear.h:
// quantize_input, sixteen lanes at a time) into dst as quantize_rows_to_quads lays them out, in
// groups of kStaticGroup elements, each recorded with the scale s and its shift.
KILN_TARGET_AVX512_VNNI void quantize_rows_static_to_quads(const float* x, int64_t k, int64_t rows,
                                                           uint32_t* dst, GroupQuant* groups,
                                                           float scale) {
  const int64_t per_row = (k + kStaticGroup - 1) / kStaticGroup;
  const __m512 inv = _mm512_set1_ps(input_inv_scale(scale));
  const __m512 lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  alignas(16) uint32_t words[4];
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * k;
    for (int64_t g0 = 0; g0 < k; g0 += kStaticGroup) {
      const int64_t g1 = std::min(k, g0 + kStaticGroup);
      __m512i total = _mm512_setzero_si512();
      for (int64_t i = g0; i < g1; i += 16) {
        const int64_t left = std::min<int64_t>(g1 - i, 16);
        const __mmask16 m = _cvtu32_mask16(left >= 16 ? 0xffffu : (1u << left) - 1);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv);
        v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);  // NaN -> 0
        // Clamped, then rounded to nearest even (the default MXCSR mode).
        const __m512i q = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(v, hi), lo));
        total = _mm512_add_epi32(total, q);
        _mm_store_si128(reinterpret_cast<__m128i*>(words), _mm512_cvtepi32_epi8(q));
        for (int64_t w = 0; w < (left + 3) / 4; ++w) dst[(i / 4 + w) * rows + t] = words[w];
      }
      groups[t * per_row + g0 / kStaticGroup] = {scale, 128 * _mm512_reduce_add_epi32(total)};
    }
  }
}

// The tiles of groups of GroupQuads quads.
template <int64_t GroupQuads>
struct QuadTiles {
  using X = uint32_t;
  using W = int8_t;
  template <int T, int P>
  static constexpr TileSet<X, W>::Full full() {
    if constexpr (T * P + P + 2 <= 32)  // accumulators, weights, a broadcast and the permutation
      return tile_quads<T, P, GroupQuads>;
    else
      return nullptr;
  }
  template <int T>
  static constexpr TileSet<X, W>::Narrow narrow() {
    return narrow_tile_quads<T, GroupQuads>;
  }
};
// Dynamic groups of 128 (int8-weight plans) and static whole rows (W8A8).
constexpr TileSet<uint32_t, int8_t> kQuadTiles = tile_set<QuadTiles<kGroupQuads>>();
constexpr TileSet<uint32_t, int8_t> kStaticQuadTiles = tile_set<QuadTiles<kStaticGroupQuads>>();

// Rows from which a call takes the int8 dot products; a single row (batch-1 decode) keeps the f32
// FMAs. Measured (bloom-560m int8-weight, batch 1, kiln bench N = 100, three interleaved rounds
// of the same binary): 13.3 / 13.3 / 13.7 ms a token with the dot products at one row against
// 12.1 / 12.1 / 12.4 with f32 FMAs and 11.5 / 11.7 / 12.3 with this threshold; flan-t5-base
// 3-4 % slower at one row (A/B of the binaries). A single row is memory-bound either way, and in
// kiln_linear_bench the dot products stream no slower (1 x 1024 x 62720: 0.79 against 0.91 ms);
// where the decode loop loses ~10 % was not found. The price: a row alone (one row in the call)
// and the same row in a batch of two or more take different paths, so int8-weight plans' rows
// are bitwise the same in every batch of two or more rows but not alone (test_backend_lowp.cc,
// test_precision.cc).
constexpr int64_t kMinRows = 2;

class VnniLinear final : public Kernel {
 public:
  explicit VnniLinear(const Node& node)
      : node_(node), single_row_(packed_linear_factory(DType::kI8)(node)) {}

  void prepare(const Graph& graph) override {
    single_row_->prepare(graph);
    x_shape_ = graph.values[node_.inputs[0]].shape;
    weight_ = panel16_weight(graph, node_);
    KILN_CHECK(weight_.dtype() == DType::kI8,
               "node '{}': the AVX512-VNNI Linear takes i8 weights, not {}", node_.name,
               dtype_name(weight_.dtype()));
  }

  // The quantized rows (ceil(k / 4) words each) and their groups.
  int64_t workspace_bytes(const Bindings& bindings) const override {
    const auto [rows, k] = input_rows(x_shape_, bindings);
    return std::max(single_row_->workspace_bytes(bindings),
                    quantized_rows_bytes(rows, (k + 3) / 4, (k + kActGroup - 1) / kActGroup));
  }

  void run(const KernelArgs& args) override {
    KILN_CHECK(args.pool != nullptr, "cpu kernel '{}' without a thread pool", node_.name);
    std::span<const Tensor> in = args.in;
    const Tensor& x = in[0];
    const float* bias = in.size() > 2 && in[2].defined() ? in[2].data<float>() : nullptr;
    const float* scales = in.size() > 3 && in[3].defined() ? in[3].data<float>() : nullptr;
    KILN_CHECK(x.dtype() == DType::kF32 && args.out[0].dtype() == DType::kF32,
               "node '{}': the cpu Linear takes and returns f32 activations", node_.name);
    KILN_CHECK(weight_.defined(), "node '{}': run before prepare", node_.name);
    KILN_CHECK(scales != nullptr, "node '{}': an i8 weight needs its scales", node_.name);
    const int64_t m = weight_.dim(0), k = weight_.dim(1);
    KILN_CHECK(x.numel() % k == 0, "node '{}': input of {} elements is not rows of {}", node_.name,
               x.numel(), k);
    if (x.numel() / k < kMinRows) return single_row_->run(args);
    const int64_t n = x.numel() / k, quads = (k + 3) / 4, per_row = (k + kActGroup - 1) / kActGroup;
    const QuantizedRows rows(args.scratch, n, quads, per_row);
    const Epilogue e{args.out[0].data<float>(), m, scales, bias};
    const Staging<uint32_t> staging{quantize_rows_to_quads<128, 1>, quads, rows.groups(), per_row};
    run_packed_linear(x.data<float>(), n, k, static_cast<const int8_t*>(weight_.raw()), m, e,
                      node_.attr<LinearAttrs>().epilogue.activation, rows.words(), staging,
                      kQuadTiles, *args.pool);
  }

 private:
  const Node& node_;
  SymShape x_shape_;
  Tensor weight_;  // panel16: the plan's mapping, or packed here
  // Fewer than kMinRows rows: the f32-FMA kernel over the same weights (see kMinRows).
  std::unique_ptr<Kernel> single_row_;
};

// W8A8 (an input scale): every row, a single one too, quantized with the static scale and summed
// in int8 dot products (batch-1 decode included: no f32 path, so a row's result is bitwise the
// same alone and in any batch).
class W8a8VnniLinear final : public Kernel {
 public:
  explicit W8a8VnniLinear(const Node& node) : node_(node) {}

  void prepare(const Graph& graph) override {
    x_shape_ = graph.values[node_.inputs[0]].shape;
    weight_ = panel16_weight(graph, node_);
    KILN_CHECK(weight_.dtype() == DType::kI8,
               "node '{}': the AVX512-VNNI W8A8 Linear takes i8 weights, not {}", node_.name,
               dtype_name(weight_.dtype()));
  }

  // The quantized rows (ceil(k / 4) words each) and their groups.
  int64_t workspace_bytes(const Bindings& bindings) const override {
    const auto [rows, k] = input_rows(x_shape_, bindings);
    return quantized_rows_bytes(rows, (k + 3) / 4, (k + kStaticGroup - 1) / kStaticGroup);
  }

  void run(const KernelArgs& args) override {
    KILN_CHECK(args.pool != nullptr, "cpu kernel '{}' without a thread pool", node_.name);
    const Tensor& x = *linear_input(args.in, LinearOperand::kX);
    const Tensor* bias = linear_input(args.in, LinearOperand::kBias);
    const Tensor* scales = linear_input(args.in, LinearOperand::kWeightScales);
    const Tensor* input_scale = linear_input(args.in, LinearOperand::kInputScale);
    KILN_CHECK(x.dtype() == DType::kF32 && args.out[0].dtype() == DType::kF32,
               "node '{}': the cpu Linear takes and returns f32 activations", node_.name);
    KILN_CHECK(weight_.defined(), "node '{}': run before prepare", node_.name);
    KILN_CHECK(scales != nullptr && input_scale != nullptr,
               "node '{}': a W8A8 Linear needs its weight scales and its input scale", node_.name);
    const float s = input_scale->data<float>()[0];
    KILN_CHECK(std::isfinite(s) && s >= 0.0f,
               "node '{}': the input scale is {}, not a finite non-negative number", node_.name, s);
    const int64_t m = weight_.dim(0), k = weight_.dim(1);
    KILN_CHECK(x.numel() % k == 0, "node '{}': input of {} elements is not rows of {}", node_.name,
               x.numel(), k);
    const int64_t n = x.numel() / k, quads = (k + 3) / 4,
                  per_row = (k + kStaticGroup - 1) / kStaticGroup;
    if (n == 0) return;
    const QuantizedRows rows(args.scratch, n, quads, per_row);
    const Epilogue e{args.out[0].data<float>(), m, scales->data<float>(),
                     bias != nullptr ? bias->data<float>() : nullptr};
    const Staging<uint32_t> staging{quantize_rows_static_to_quads, quads, rows.groups(), per_row,
                                    s};
    run_packed_linear(x.data<float>(), n, k, static_cast<const int8_t*>(weight_.raw()), m, e,
                      node_.attr<LinearAttrs>().epilogue.activation, rows.words(), staging,
                      kStaticQuadTiles, *args.pool);
  }

 private:
  const Node& node_;
  SymShape x_shape_;
  Tensor weight_;  // panel16: the plan's mapping, or packed here
};

}  // namespace

KernelFactory packed_int8_dot_linear_factory() {
  return [](const Node& n) { return std::make_unique<VnniLinear>(n); };
}

KernelFactory packed_w8a8_vnni_linear_factory() {
  return [](const Node& n) { return std::make_unique<W8a8VnniLinear>(n); };
}

}  // namespace kiln::cpu
