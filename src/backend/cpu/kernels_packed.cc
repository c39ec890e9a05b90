// The AVX-512 Linear: weights in the panel16 layout (graph/packing.h) — packed in the plan at
// build time, or packed here once when the plan stores them plain — for f32, bf16, f16 and int8
// (per-output-channel f32 scales) weights; f32 activations and accumulation.
//
// One register-blocked micro-kernel serves every number of rows: a tile of T rows × P panels
// (16 outputs each) keeps T·P accumulators in registers; each step over the input dimension
// loads P weight vectors (widened to f32 in registers) and multiplies each by T broadcast
// activations, so a weight load serves T rows (batched decode, prefill) and a single row streams
// the weights with P independent chains (batch-1 decode).
//
// Batch invariance: every output is one fused-multiply-add chain over the input dimension in
// index order, starting from zero, then × scale, + bias, the activation — whatever T, P, the
// number of rows or threads. A row's result is therefore bit-identical alone or in any batch,
// decode and prefill alike.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/packed_linear.h"
#include "core/half.h"
#include "graph/packing.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 widening
// intrinsics as "maybe uninitialized" once they inline here (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::cpu {
namespace {

using namespace packed;

// 16 consecutive weights of a panel widened to f32.
struct F32W {
  using X = float;  // activations as the tiles read them
  using T = float;
  KILN_TARGET_AVX512 static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
  static float one(float v) { return v; }
};
struct Bf16W {
  using X = float;  // activations as the tiles read them
  using T = uint16_t;
  KILN_TARGET_AVX512 static __m512 load16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static float one(uint16_t v) { return bf16_to_float(v); }
};
struct F16W {
  using X = float;  // activations as the tiles read them
  using T = uint16_t;
  KILN_TARGET_AVX512 static __m512 load16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static float one(uint16_t v) { return fp16_to_float(v); }
};
struct I8W {
  using X = float;  // activations as the tiles read them
  using T = int8_t;
  KILN_TARGET_AVX512 static __m512 load16(const int8_t* p) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
  }
  static float one(int8_t v) { return static_cast<float>(v); }
};

// bf16 weights times bf16 activations in AVX512-BF16 dot products (vdpbf16ps: two products
// summed into each f32 lane, twice the f32 FMA rate; the products are exact, the sums f32).
// The activations are rounded to bf16 (to nearest even) once per row and held as pairs of
// consecutive elements, one 32-bit word each, so that a pair is a single broadcast.
struct Bf16DotW {
  using X = uint32_t;
  using T = uint16_t;
};

// One input element i: P weight vectors, each multiplied by T broadcast activations.
template <class W, int T, int P>
KILN_TARGET_AVX512 __attribute__((always_inline)) inline void tile_step(__m512 (&acc)[T][P],
                                                                        const float* x, int64_t ldx,
                                                                        const typename W::T* w,
                                                                        int64_t panel, int64_t i) {
  __m512 wv[P];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p) wv[p] = W::load16(w + p * panel + i * kPanelRows);
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m512 xb = _mm512_set1_ps(x[i * ldx + t]);
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_fmadd_ps(xb, wv[p], acc[t][p]);
  }
}

// Rows [0, T) of x, interleaved (element i of row t at x[i·ldx + t]) × P full panels starting at
// output o (panel p at w + p·16·k): y[t, o + 16p + j] for j < 16. `next`: the weights of the
// group of panels this thread runs next (null when unknown), whose first lines are requested
// while this tile finishes.
template <class W, int T, int P>
KILN_TARGET_AVX512 void tile(const float* x, int64_t ldx, const typename W::T* w,
                             const typename W::T* next, int64_t k, int64_t o, const Epilogue& e) {
  __m512 acc[T][P];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_setzero_ps();
  const int64_t panel = kPanelRows * k;
  // One cache line of each panel per outer step; the lines kPrefetchBytes ahead are requested
  // then: the P panels are P streams far apart, which the hardware prefetcher alone follows too
  // slowly for narrow weights. Past the end of the panels the requests continue into the next
  // group's P streams, so that a thread does not start each group with its streams cold (a
  // 1,024-wide i8 panel is only 16 KB).
  constexpr int64_t kLine = 64 / (kPanelRows * sizeof(typename W::T));
  constexpr int64_t kAhead = kPrefetchBytes / (kPanelRows * sizeof(typename W::T));
  const int64_t here = std::max<int64_t>(k - kAhead, 0) / kLine * kLine;
  int64_t i = 0;
  for (; i < here; i += kLine) {
    for (int p = 0; p < P; ++p)
      _mm_prefetch(reinterpret_cast<const char*>(w + p * panel + (i + kAhead) * kPanelRows),
                   _MM_HINT_T0);
    for (int64_t u = 0; u < kLine; ++u) tile_step<W, T, P>(acc, x, ldx, w, panel, i + u);
  }
  for (; i + kLine <= k; i += kLine) {
    if (next != nullptr) {
      const int64_t ahead = std::max<int64_t>(i + kAhead - k, 0);
      for (int p = 0; p < P; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(next + p * panel + ahead * kPanelRows),
                     _MM_HINT_T0);
    }
    for (int64_t u = 0; u < kLine; ++u) tile_step<W, T, P>(acc, x, ldx, w, panel, i + u);
  }
  for (; i < k; ++i) tile_step<W, T, P>(acc, x, ldx, w, panel, i);
  store_tile<T, P>(acc, o, e);
}

// The last panel when the outputs are not a multiple of 16: `width` < 16 outputs, stored
// `width` apart. The same chain per output, with the weights gathered into a full vector.
template <class W, int T>
KILN_TARGET_AVX512 void narrow_tile(const float* x, int64_t ldx, const typename W::T* w, int64_t k,
                                    int64_t o, int64_t width, const Epilogue& e) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  alignas(64) float wide[kPanelRows] = {};
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < width; ++j) wide[j] = W::one(w[i * width + j]);
    const __m512 wv = _mm512_load_ps(wide);
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + t]), wv, acc[t]);
  }
  store_narrow<T>(acc, o, width, e);
}

#define KILN_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

// A panel holds element i of its 16 outputs as 16 consecutive bf16, so one 64-byte line holds
// elements i and i + 1 (i even); vdpbf16ps wants each output's two elements side by side in a
// 32-bit lane: word j = (w[i][j], w[i+1][j]).
KILN_TARGET_AVX512_BF16 inline __m512i pair_permutation() {
  return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                          6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}

// One pair of input elements (2·ip, 2·ip + 1): P weight lines, each dotted with T broadcast
// activation pairs.
template <int T, int P>
KILN_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void pair_step(
    __m512 (&acc)[T][P], const uint32_t* x, int64_t ldx, const uint16_t* w, int64_t panel,
    int64_t ip, __m512i perm) {
  __m512bh wv[P];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
    wv[p] = reinterpret_cast<__m512bh>(
        _mm512_permutexvar_epi16(perm, _mm512_loadu_si512(w + p * panel + ip * 2 * kPanelRows)));
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m512bh xb =
        reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[ip * ldx + t])));
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_dpbf16_ps(acc[t][p], xb, wv[p]);
  }
}

// The Bf16DotW tile: rows [0, T) of x as interleaved pairs (pair ip of row t at x[ip·ldx + t])
// × P full panels. Every output is one vdpbf16ps chain over the pairs in order, from zero: the
// same bits whatever T, P or the rows around it. An odd k ends with the pair (x, 0) against
// (w, 0).
template <int T, int P>
KILN_TARGET_AVX512_BF16 void tile_pairs(const uint32_t* x, int64_t ldx, const uint16_t* w,
                                        const uint16_t* next, int64_t k, int64_t o,
                                        const Epilogue& e) {
  __m512 acc[T][P];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_setzero_ps();
  const __m512i perm = pair_permutation();
  const int64_t panel = kPanelRows * k, pairs = k / 2;
  // A pair step reads one line of each panel: the prefetches run kDotPrefetchBytes ahead, then
  // on into the next group (as tile() does).
  constexpr int64_t kAhead = kDotPrefetchBytes / 64;
  const int64_t here = std::max<int64_t>(pairs - kAhead, 0);
  int64_t ip = 0;
  for (; ip < here; ++ip) {
    for (int p = 0; p < P; ++p)
      _mm_prefetch(reinterpret_cast<const char*>(w + p * panel + (ip + kAhead) * 2 * kPanelRows),
                   _MM_HINT_T0);
    pair_step<T, P>(acc, x, ldx, w, panel, ip, perm);
  }
  for (; ip < pairs; ++ip) {
    if (next != nullptr)
      for (int p = 0; p < P; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(next + p * panel +
                                                   (ip + kAhead - pairs) * 2 * kPanelRows),
                     _MM_HINT_T0);
    pair_step<T, P>(acc, x, ldx, w, panel, ip, perm);
  }
  if (k % 2 != 0) {
    __m512bh wv[P];
    for (int p = 0; p < P; ++p)
      wv[p] = reinterpret_cast<__m512bh>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(w + p * panel + (k - 1) * kPanelRows))));
    for (int t = 0; t < T; ++t) {
      const __m512bh xb =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[pairs * ldx + t])));
      for (int p = 0; p < P; ++p) acc[t][p] = _mm512_dpbf16_ps(acc[t][p], xb, wv[p]);
    }
  }
  store_tile<T, P>(acc, o, e);
}

// The last, narrower panel for Bf16DotW: `width` < 16 outputs stored `width` apart, gathered
// pair by pair into a full line of (w[i][j], w[i+1][j]) words; the same chain per output.
template <int T>
KILN_TARGET_AVX512_BF16 void narrow_tile_pairs(const uint32_t* x, int64_t ldx, const uint16_t* w,
                                               int64_t k, int64_t o, int64_t width,
                                               const Epilogue& e) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  alignas(64) uint16_t wide[2 * kPanelRows] = {};
  for (int64_t ip = 0; ip < (k + 1) / 2; ++ip) {
    const int64_t i = 2 * ip;
    for (int64_t j = 0; j < width; ++j) {
      wide[2 * j] = w[i * width + j];
      wide[2 * j + 1] = i + 1 < k ? w[(i + 1) * width + j] : uint16_t{0};
    }
    const __m512bh wv = reinterpret_cast<__m512bh>(_mm512_load_si512(wide));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_dpbf16_ps(
          acc[t], reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[ip * ldx + t]))),
          wv);
  }
  store_narrow<T>(acc, o, width, e);
}

// Rows [t0, t0 + rows) of x [n, k] rounded to bf16 and interleaved as pairs into dst (pair ip
// of row t at dst[ip·rows + t]; an odd k's last pair is (x, 0)). Each value is rounded on its
// own, so a row's pairs do not depend on the other rows.
KILN_TARGET_AVX512_BF16 void round_rows_to_pairs(const float* x, int64_t k, int64_t rows,
                                                 uint32_t* dst, GroupQuant* /*groups*/,
                                                 float /*scale*/) {
  alignas(64) uint32_t words[16];
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * k;
    for (int64_t i = 0; i < k; i += 32) {
      const int64_t left = std::min<int64_t>(k - i, 32);
      const __mmask16 lo = _cvtu32_mask16(left >= 16 ? 0xffffu : (1u << left) - 1);
      const __mmask16 hi = _cvtu32_mask16(left >= 32  ? 0xffffu
                                          : left > 16 ? (1u << (left - 16)) - 1
                                                      : 0);
      const __m512 a = _mm512_maskz_loadu_ps(lo, xr + i);
      const __m512 b = _mm512_maskz_loadu_ps(hi, xr + i + 16);
      // Element 2q of the 32 (low half from the second operand) is a's lane 2q: words in order.
      _mm512_store_si512(words, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
      for (int64_t q = 0; q < (left + 1) / 2; ++q) dst[(i / 2 + q) * rows + t] = words[q];
    }
  }
}

// The tiles of weight type Weight (Bf16DotW: its pair tiles).
template <class Weight>
struct PackedTiles {
  using X = typename Weight::X;
  using W = typename Weight::T;
  template <int T, int P>
  static constexpr typename TileSet<X, W>::Full full() {
    if constexpr (std::is_same_v<Weight, Bf16DotW>) {
      if constexpr (T * P + P + 2 <= 32)  // ... and the pair permutation
        return tile_pairs<T, P>;
      else
        return nullptr;
    } else if constexpr (T * P + P + 1 <= 32) {  // accumulators, weights and a broadcast
      return tile<Weight, T, P>;
    } else {
      return nullptr;
    }
  }
  template <int T>
  static constexpr typename TileSet<X, W>::Narrow narrow() {
    if constexpr (std::is_same_v<Weight, Bf16DotW>)
      return narrow_tile_pairs<T>;
    else
      return narrow_tile<Weight, T>;
  }
};
template <class W>
constexpr TileSet<typename W::X, typename W::T> kTiles = tile_set<PackedTiles<W>>();

// The kernel object: finds (or makes) the packed weights once, then runs run_packed_linear.
template <class W>
class PackedLinear final : public Kernel {
 public:
  explicit PackedLinear(const Node& node) : node_(node) {}

  void prepare(const Graph& graph) override {
    x_shape_ = graph.values[node_.inputs[0]].shape;
    weight_ = panel16_weight(graph, node_);
  }

  // The interleaved input rows: as many floats as the input (bf16 pairs need half of that).
  int64_t workspace_bytes(const Bindings& bindings) const override {
    const Shape shape = resolve_shape(x_shape_, bindings);
    int64_t floats = 1;
    for (int64_t d : shape) floats *= d;
    return floats * static_cast<int64_t>(sizeof(float));
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
    KILN_CHECK((!std::is_same_v<W, Bf16DotW> || weight_.dtype() == DType::kBF16),
               "node '{}': the AVX512-BF16 Linear takes bf16 weights, not {}", node_.name,
               dtype_name(weight_.dtype()));
    KILN_CHECK((weight_.dtype() == DType::kI8) == (scales != nullptr),
               "node '{}': an i8 weight needs its scales, and only an i8 weight has them",
               node_.name);
    const int64_t m = weight_.dim(0), k = weight_.dim(1);
    const int64_t n = x.numel() / k;
    const Epilogue e{args.out[0].data<float>(), m, scales, bias};
    std::vector<typename W::X> own;  // callers without a workspace (micro-benchmarks)
    auto* xt = static_cast<typename W::X*>(args.scratch);
    if (xt == nullptr && (n > 1 || std::is_same_v<W, Bf16DotW>)) {
      own.resize(static_cast<size_t>(n * k));
      xt = own.data();
    }
    Staging<typename W::X> staging;
    if constexpr (std::is_same_v<W, Bf16DotW>) staging = {round_rows_to_pairs, (k + 1) / 2};
    run_packed_linear(x.data<float>(), n, k, static_cast<const typename W::T*>(weight_.raw()), m, e,
                      node_.attr<LinearAttrs>().epilogue.activation, xt, staging, kTiles<W>,
                      *args.pool);
  }

 private:
  const Node& node_;
  SymShape x_shape_;
  Tensor weight_;  // panel16: the plan's mapping, or packed here
};

}  // namespace

namespace packed {

Tensor panel16_weight(const Graph& graph, const Node& node) {
  const Value& w = graph.values[node.inputs[1]];
  KILN_CHECK(w.kind == ValueKind::kWeight && w.data.defined() && w.data.rank() == 2,
             "node '{}': the avx512 Linear needs a constant 2-d weight", node.name);
  return packed_or_pack(node, w, panel16_layout(), w.data.dtype(), w.data.shape(),
                        [](const Tensor& plain, Tensor& out) {
                          pack_panel16(plain.raw(), out.raw(), plain.dim(0), plain.dim(1),
                                       dtype_bytes(plain.dtype(), 1));
                        });
}

}  // namespace packed

KernelFactory packed_linear_factory(DType weight) {
  switch (weight) {
    case DType::kF32:
      return [](const Node& n) { return std::make_unique<PackedLinear<F32W>>(n); };
    case DType::kBF16:
      return [](const Node& n) { return std::make_unique<PackedLinear<Bf16W>>(n); };
    case DType::kF16:
      return [](const Node& n) { return std::make_unique<PackedLinear<F16W>>(n); };
    case DType::kI8:
      return [](const Node& n) { return std::make_unique<PackedLinear<I8W>>(n); };
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4:  // kernels_int4.cc: its own layout
      break;
  }
  KILN_FAIL("no packed avx512 Linear for {} weights", dtype_name(weight));
}

KernelFactory packed_bf16_dot_linear_factory() {
  return [](const Node& n) { return std::make_unique<PackedLinear<Bf16DotW>>(n); };
}

}  // namespace kiln::cpu
