// The int4-weight Linear of the AVX-512 family: i4 weights (graph/linear.h: q in [-8, 7], one f16
// scale per output and group of 128 inputs) in the panel16q4 layout (graph/packing.h), f32
// activations quantized on the fly to int8 in groups of 128 (packed_linear.h:
// quantize_rows_to_quads, the int8-weight dot products' definition), integer dot products.
//
// Why integers: decode is memory-bound, and an i4 weight is half an i8 weight's bytes, so the
// kernel must spend half as long on each byte. Widening nibbles to f32 costs an extraction, a
// conversion and an FMA per 16 weights; here one 64-byte line (128 weights: 16 outputs × 8
// inputs) costs one load, a xor, two masks, a shift and two dot-product instructions a row
// (vpdpbusd: u8 × s8, four products a lane). The weights take the unsigned side as u = q + 8
// (the xor with 0x88 flips each nibble's sign bit), and each activation group's sums carry
// 8 · Σ q_x, recorded with the group (GroupQuant::shift) and taken off before scaling:
//   y[t][o] = Σ_g f32(Σ_{i∈g} q_x[t][i] · u[o][i] − 8 · Σ_{i∈g} q_x[t][i])
//             · (scale_w[o][g] · a[t][g]) + bias[o],
// each group's integer part exact (|Σ| <= 128 · 127 · 15 < 2^24, so its f32 conversion too),
// weight and activation groups the same 128 inputs.
//
// Two dot products, one tile: vpdpbusd (AVX512-VNNI), and where the context has no VNNI
// (KILN_CPU_INT8_DOT=off, or a CPU without it) vpmaddubsw + vpmaddwd, whose pair sums (at most
// 2 · 15 · 127) cannot saturate: the same integers, so both give the same bits. Every tile is
// compiled for the VNNI target (one set of templates); the BwDot tiles contain no VNNI
// instruction (vpmaddubsw saturates, so no compiler fuses the pair into vpdpbusd).
//
// Batch invariance: a row's groups depend on that row alone and each output sums its groups in
// order, so a row's result is bit-identical alone and in any batch, tile or thread — batch-1
// decode included (no f32 path here, unlike int8-weight's kMinRows).
#include <immintrin.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <utility>

#include "backend/cpu/kernels.h"
#include "backend/cpu/packed_linear.h"
#include "graph/linear.h"
#include "graph/packing.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as
// "(maybe) uninitialized" once they inline here (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::cpu {
namespace {

using namespace packed;

#define KILN_TARGET_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

static_assert(kInt4Group == kActGroup, "weight and activation groups must be the same inputs");
constexpr int64_t kBlocksPerGroup = kInt4Group / 8;  // 8 inputs (one line of a panel) a block
constexpr int64_t kLine = 4 * kPanelRows;            // bytes of a full panel's block

// Sums of u8 × s8 products, four into each s32 lane.
struct VnniDot {
  KILN_TARGET_AVX512_VNNI static __m512i dot(__m512i acc, __m512i u, __m512i s) {
    return _mm512_dpbusd_epi32(acc, u, s);
  }
};
struct BwDot {
  KILN_TARGET_AVX512_VNNI static __m512i dot(__m512i acc, __m512i u, __m512i s) {
    return _mm512_add_epi32(acc,
                            _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
};

// One block of 8 inputs (quads 2b and 2b + 1): P lines of `bytes` (a full line, or a narrow
// panel's 4·width bytes), each dotted with T broadcast activation quads, the low nibbles with
// quad 2b and the high ones with quad 2b + 1. Past `bytes` the loads read zeros; those lanes'
// sums are never stored.
template <class D, int T, int P>
KILN_TARGET_AVX512_VNNI __attribute__((always_inline)) inline void block_step(
    __m512i (&acc)[T][P], const uint32_t* x, int64_t ldx, const uint8_t* w, int64_t panel,
    int64_t line, int64_t b, __mmask64 bytes) {
  const __m512i low = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x88));
  __m512i wv[P];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
    wv[p] = _mm512_and_si512(
        _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes, w + p * panel + b * line), flip), low);
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p)
      acc[t][p] = D::dot(acc[t][p], wv[p], _mm512_set1_epi32(static_cast<int>(x[2 * b * ldx + t])));
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
    wv[p] = _mm512_and_si512(
        _mm512_srli_epi16(
            _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes, w + p * panel + b * line), flip), 4),
        low);
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p)
      acc[t][p] =
          D::dot(acc[t][p], wv[p], _mm512_set1_epi32(static_cast<int>(x[(2 * b + 1) * ldx + t])));
}

// Group g's integer sums into the f32 sums: the shift taken off, × the weight scales of the P
// panels (16 f16 each at `scales` + p·panel_scales, `lanes` of them) × the row's group scale.
template <int T, int P>
KILN_TARGET_AVX512_VNNI __attribute__((always_inline)) inline void add_group(
    __m512 (&sum)[T][P], const __m512i (&acc)[T][P], const Epilogue& e, int64_t g,
    const uint16_t* scales, int64_t panel_scales, __mmask16 lanes) {
  __m512 ws[P];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
    ws[p] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, scales + p * panel_scales));
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const GroupQuant& q = e.groups[t * e.groups_per_row + g];
    const __m512i shift = _mm512_set1_epi32(q.shift);
    const __m512 a = _mm512_set1_ps(q.scale);
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p)
      sum[t][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t][p], shift)),
                                  _mm512_mul_ps(ws[p], a), sum[t][p]);
  }
}

// Rows [0, T) of x (interleaved quads, quad iq of row t at x[iq·ldx + t]; zero quads up to a
// whole block) × P full panels from output o. `next`: the panels this thread runs next, whose
// first lines are requested while this tile ends.
template <class D, int T, int P>
KILN_TARGET_AVX512_VNNI void tile_q4(const uint32_t* x, int64_t ldx, const uint8_t* w,
                                     const uint8_t* next, int64_t k, int64_t o, const Epilogue& e) {
  __m512 sum[T][P];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) sum[t][p] = _mm512_setzero_ps();
  const int64_t blocks = (k + 7) / 8, panel = blocks * kLine, groups = e.groups_per_row;
  const __mmask64 all = _cvtu64_mask64(~uint64_t{0});
  // As the int8 dot products' tiles: prefetches a fixed distance ahead in each panel, on into
  // the next group of panels at the end; tiles of many rows spend longer on each line.
  constexpr int64_t kAhead = (T >= 4 ? kDotPrefetchBytes : kPrefetchBytes) / 64;
  for (int64_t g = 0, b0 = 0; b0 < blocks; ++g, b0 += kBlocksPerGroup) {
    __m512i acc[T][P];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) acc[t][p] = _mm512_setzero_si512();
    const int64_t b1 = std::min(blocks, b0 + kBlocksPerGroup);
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* line = line_ahead(w, next, b, blocks, kAhead, kLine);
      for (int p = 0; p < P; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(line + p * panel), _MM_HINT_T0);
      block_step<D, T, P>(acc, x, ldx, w, panel, kLine, b, all);
    }
    // Panel p's scales of group g: (o + 16p) · groups + 16g (panel16 f16 [m, groups]).
    add_group<T, P>(sum, acc, e, g, e.group_scales + o * groups + g * kPanelRows,
                    kPanelRows * groups, _cvtu32_mask16(0xffffu));
  }
  store_tile<T, P>(sum, o, e);
}

// The last, narrower panel: `width` < 16 outputs, blocks of 4·width bytes, scales `width` apart.
template <class D, int T>
KILN_TARGET_AVX512_VNNI void narrow_tile_q4(const uint32_t* x, int64_t ldx, const uint8_t* w,
                                            int64_t k, int64_t o, int64_t width,
                                            const Epilogue& e) {
  __m512 sum[T][1];
  for (int t = 0; t < T; ++t) sum[t][0] = _mm512_setzero_ps();
  const int64_t blocks = (k + 7) / 8, groups = e.groups_per_row;
  const __mmask64 bytes = _cvtu64_mask64((uint64_t{1} << (4 * width)) - 1);
  const __mmask16 lanes = _cvtu32_mask16((1u << width) - 1);
  for (int64_t g = 0, b0 = 0; b0 < blocks; ++g, b0 += kBlocksPerGroup) {
    __m512i acc[T][1];
    for (int t = 0; t < T; ++t) acc[t][0] = _mm512_setzero_si512();
    for (int64_t b = b0; b < std::min(blocks, b0 + kBlocksPerGroup); ++b)
      block_step<D, T, 1>(acc, x, ldx, w, 0, 4 * width, b, bytes);
    add_group<T, 1>(sum, acc, e, g, e.group_scales + o * groups + g * width, 0, lanes);
  }
  __m512 out[T];
  for (int t = 0; t < T; ++t) out[t] = sum[t][0];
  store_narrow<T>(out, o, width, e);
}

// Bytes of a panel16q4 row (k rounded up to whole blocks of 8, two a byte).
constexpr int64_t q4_row_bytes(int64_t k) { return (k + 7) / 8 * 4; }

template <class D>
struct Q4Tiles {
  using X = uint32_t;
  using W = uint8_t;
  template <int T, int P>
  static constexpr TileSet<X, W>::Full full() {
    if constexpr (T * P + P + 2 <= 32)  // accumulators, weights, a broadcast and the masks
      return tile_q4<D, T, P>;
    else
      return nullptr;
  }
  template <int T>
  static constexpr TileSet<X, W>::Narrow narrow() {
    return narrow_tile_q4<D, T>;
  }
  static constexpr int64_t (*row_units)(int64_t) = q4_row_bytes;
};
template <class D>
constexpr TileSet<uint32_t, uint8_t> kQ4Tiles = tile_set<Q4Tiles<D>>();

// The node's i4 weight in panel16q4: the plan's mapping, or packed here once (a plain plan, one
// built in memory, or a width that plans store plain) as an i4 [n, k8] tensor.
Tensor panel16q4_weight(const Graph& graph, const Node& node) {
  const Value& w = graph.values[linear_operand(node, LinearOperand::kWeight)];
  KILN_CHECK(w.kind == ValueKind::kWeight && w.data.defined() && w.data.rank() == 2 &&
                 w.dtype == DType::kI4,
             "node '{}': the avx512 int4 Linear needs a constant 2-d i4 weight", node.name);
  const int64_t n = w.data.dim(0), k = w.data.dim(1);
  return packed_or_pack(
      node, w, panel16q4_layout(), DType::kI4, {n, (k + 7) / 8 * 8},
      [&](const Tensor& plain, Tensor& out) { pack_panel16q4(plain.raw(), out.raw(), n, k); });
}

// The node's f16 group scales [n, groups] in panel16: the plan's, or packed here once.
Tensor panel16_group_scales(const Graph& graph, const Node& node) {
  const int id = linear_operand(node, LinearOperand::kWeightScales);
  KILN_CHECK(id >= 0, "node '{}': an i4 weight needs its group scales", node.name);
  const Value& s = graph.values[id];
  KILN_CHECK(s.kind == ValueKind::kWeight && s.data.defined() && s.data.rank() == 2 &&
                 s.dtype == DType::kF16,
             "node '{}': the group scales '{}' of an i4 weight must be a constant f16 matrix",
             node.name, s.name);
  return packed_or_pack(
      node, s, panel16_layout(), DType::kF16, s.data.shape(), [](const Tensor& plain, Tensor& out) {
        pack_panel16(plain.raw(), out.raw(), plain.dim(0), plain.dim(1), sizeof(uint16_t));
      });
}

template <class D>
class Int4Linear final : public Kernel {
 public:
  explicit Int4Linear(const Node& node) : node_(node) {}

  void prepare(const Graph& graph) override {
    x_shape_ = graph.values[node_.inputs[0]].shape;
    weight_ = panel16q4_weight(graph, node_);
    scales_ = panel16_group_scales(graph, node_);
    k_ = graph.values[linear_operand(node_, LinearOperand::kWeight)].data.dim(1);
    KILN_CHECK(scales_.dim(0) == weight_.dim(0) && scales_.dim(1) == int4_groups(k_),
               "node '{}': group scales {} for an i4 weight of {} outputs and {} inputs",
               node_.name, shape_str(scales_.shape()), weight_.dim(0), k_);
  }

  // The quantized rows (whole blocks of two quads each) and their groups.
  int64_t workspace_bytes(const Bindings& bindings) const override {
    const auto [rows, k] = input_rows(x_shape_, bindings);
    return quantized_rows_bytes(rows, (k + 7) / 8 * 2, int4_groups(k));
  }

  void run(const KernelArgs& args) override {
    KILN_CHECK(args.pool != nullptr, "cpu kernel '{}' without a thread pool", node_.name);
    const Tensor& x = *linear_input(args.in, LinearOperand::kX);
    const Tensor* bias = linear_input(args.in, LinearOperand::kBias);
    KILN_CHECK(x.dtype() == DType::kF32 && args.out[0].dtype() == DType::kF32,
               "node '{}': the cpu Linear takes and returns f32 activations", node_.name);
    KILN_CHECK(weight_.defined(), "node '{}': run before prepare", node_.name);
    const int64_t m = weight_.dim(0), k = k_;
    KILN_CHECK(x.numel() % k == 0, "node '{}': input of {} elements is not rows of {}", node_.name,
               x.numel(), k);
    const int64_t n = x.numel() / k, words = (k + 7) / 8 * 2, per_row = int4_groups(k);
    if (n == 0) return;
    const QuantizedRows rows(args.scratch, n, words, per_row);
    Epilogue e{args.out[0].data<float>(), m, nullptr,
               bias != nullptr ? bias->data<float>() : nullptr};
    e.group_scales = static_cast<const uint16_t*>(scales_.raw());
    const Staging<uint32_t> staging{quantize_rows_to_quads<8, 2>, words, rows.groups(), per_row};
    run_packed_linear(x.data<float>(), n, k, static_cast<const uint8_t*>(weight_.raw()), m, e,
                      node_.attr<LinearAttrs>().epilogue.activation, rows.words(), staging,
                      kQ4Tiles<D>, *args.pool);
  }

 private:
  const Node& node_;
  SymShape x_shape_;
  Tensor weight_;  // panel16q4: the plan's mapping, or packed here
  Tensor scales_;  // f16 [m, groups], panel16
  int64_t k_ = 0;  // inputs (the packed weight's rows may be padded past them)
};

}  // namespace

KernelFactory packed_int4_linear_factory(bool vnni) {
  if (vnni) return [](const Node& n) { return std::make_unique<Int4Linear<VnniDot>>(n); };
  return [](const Node& n) { return std::make_unique<Int4Linear<BwDot>>(n); };
}

}  // namespace kiln::cpu
