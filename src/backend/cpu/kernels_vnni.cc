// The int8-weight Linear in AVX512-VNNI dot products (vpdpbusd: four u8 × s8 products summed
// into each s32 lane) over the same panel16-packed i8 weights the f32 kernel reads, so a plan
// packed for avx512 runs either way and the choice is the context's (cpu_int8_dot).
//
// Each activation row is quantized on its own: scale a = max|x| / 127, q = x · (127 / max|x|)
// rounded to nearest even, held as u8 = q + 128 because vpdpbusd multiplies unsigned by signed
// bytes. The shift adds 128 · Σᵢ w[o][i] to every output's sum; that sum is computed once per
// weight when the kernel is prepared and taken off in the epilogue. Then
//   y[t][o] = f32(Σᵢ u[t][i] · w[o][i] − 128 · Σᵢ w[o][i]) · a[t] · scale[o] + bias[o],
// which is Σᵢ q[t][i] · w[o][i] exactly in integers (|sum| < 2^31 for k < 66,000).
//
// Why: batched decode of int8-weight plans was compute-bound in f32 FMAs (each i8 weight widened
// to f32, then one FMA per row): a 16-row bloom-560m step took 79-84 ms against ~12 ms at batch
// 1. One vpdpbusd does 64 multiply-adds where an FMA does 16.
//
// Batch invariance: integer sums are exact in any order, and a row's quantization reads only the
// row, so a row's result is bit-identical alone, in any batch, in any tile, on any thread.
//
// Layout: a panel16 line of an i8 panel holds elements i .. i+3 (i a multiple of 4) of its 16
// outputs, byte 16u + j = w[o0 + j][i + u]; vpdpbusd wants output j's four bytes side by side in
// lane j (byte 4j + u). One vpermb (AVX512-VBMI) per line reorders it in registers, as the bf16
// dot products reorder their pairs.
#include <immintrin.h>

#include <algorithm>
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
// last quad (the rest loads as zero).
template <int T, int P>
KILN_TARGET_AVX512_VNNI __attribute__((always_inline)) inline void quad_step(
    __m512i (&acc)[T][P], const uint32_t* x, int64_t ldx, const int8_t* w, int64_t panel,
    int64_t iq, __m512i perm, __mmask64 bytes) {
  __m512i wv[P];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
    wv[p] = _mm512_permutexvar_epi8(
        perm, _mm512_maskz_loadu_epi8(bytes, w + p * panel + iq * 4 * kPanelRows));
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m512i xb = _mm512_set1_epi32(static_cast<int>(x[iq * ldx + t]));
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_dpbusd_epi32(acc[t][p], xb, wv[p]);
  }
}

// The integer sums of T rows × P outputs-vectors to f32: the shift taken off, × the row's scale
// (store_tile then applies the weight scales and the bias).
template <int T, int P>
KILN_TARGET_AVX512_VNNI __attribute__((always_inline)) inline void store_sums(
    const __m512i (&acc)[T][P], int64_t o, const Epilogue& e) {
  __m512 out[T][P];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m512 a = _mm512_set1_ps(e.row_scales[t]);
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) {
      const __m512i shift = _mm512_loadu_si512(e.shift_sums + o + p * kPanelRows);
      out[t][p] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t][p], shift)), a);
    }
  }
  store_tile<T, P>(out, o, e);
}

// Rows [0, T) of x as interleaved quads (quad iq of row t at x[iq·ldx + t]) × P full panels
// starting at output o. k need not be a multiple of 4: the last, partial line is loaded with
// its missing elements zero.
template <int T, int P>
KILN_TARGET_AVX512_VNNI void tile_quads(const uint32_t* x, int64_t ldx, const int8_t* w,
                                        const int8_t* next, int64_t k, int64_t o,
                                        const Epilogue& e) {
  __m512i acc[T][P];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_setzero_si512();
  const __m512i perm = quad_permutation();
  const int64_t panel = kPanelRows * k, quads = k / 4;
  // A quad step reads one line of each panel: the prefetches run ahead, then on into the next
  // group (as the other tiles do); tiles of many rows spend longer on each line and need the
  // longer distance.
  constexpr int64_t kAhead = (T >= 4 ? kDotPrefetchBytes : kPrefetchBytes) / 64;
  // One loop, the partial last quad included (with a tail block after the loop, or two loops,
  // GCC 12 stored the accumulators to the stack on every step): the prefetch address moves on to
  // the next group's lines, or repeats this line without one.
  const int64_t steps = (k + 3) / 4;
  const __mmask64 last =
      _cvtu64_mask64(k % 4 == 0 ? ~uint64_t{0} : (uint64_t{1} << (16 * (k % 4))) - 1);
  for (int64_t iq = 0; iq < steps; ++iq) {
    const int64_t ahead = iq + kAhead;
    const int8_t* line = ahead < quads     ? w + ahead * 4 * kPanelRows
                         : next != nullptr ? next + (ahead - quads) * 4 * kPanelRows
                                           : w + iq * 4 * kPanelRows;
    for (int p = 0; p < P; ++p)
      _mm_prefetch(reinterpret_cast<const char*>(line + p * panel), _MM_HINT_T0);
    quad_step<T, P>(acc, x, ldx, w, panel, iq, perm,
                    iq < quads ? _cvtu64_mask64(~uint64_t{0}) : last);
  }
  store_sums<T, P>(acc, o, e);
}

// The last, narrower panel: `width` < 16 outputs stored `width` apart, gathered quad by quad
// into a full line; the same sums per output.
template <int T>
KILN_TARGET_AVX512_VNNI void narrow_tile_quads(const uint32_t* x, int64_t ldx, const int8_t* w,
                                               int64_t k, int64_t o, int64_t width,
                                               const Epilogue& e) {
  __m512i acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
  alignas(64) int8_t wide[4 * kPanelRows] = {};
  for (int64_t iq = 0; iq < (k + 3) / 4; ++iq) {
    for (int64_t j = 0; j < width; ++j)
      for (int64_t u = 0; u < 4; ++u) {
        const int64_t i = 4 * iq + u;
        wide[4 * j + u] = i < k ? w[i * width + j] : int8_t{0};
      }
    const __m512i wv = _mm512_load_si512(wide);
    for (int t = 0; t < T; ++t)
      acc[t] =
          _mm512_dpbusd_epi32(acc[t], _mm512_set1_epi32(static_cast<int>(x[iq * ldx + t])), wv);
  }
  const __mmask16 lanes = _cvtu32_mask16((1u << width) - 1);
  const __m512i shift = _mm512_maskz_loadu_epi32(lanes, e.shift_sums + o);
  __m512 out[T];
  for (int t = 0; t < T; ++t)
    out[t] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t], shift)),
                           _mm512_set1_ps(e.row_scales[t]));
  store_narrow<T>(out, o, width, e);
}

// Rows [0, rows) of x [rows, k] quantized into dst as interleaved quads of u8 (quad iq of row t
// at dst[iq·rows + t]; a partial last quad is padded with 128, i.e. 0, against zero weights), and
// each row's scale into row_scales[t]. A row's bytes and scale depend on that row alone.
KILN_TARGET_AVX512_VNNI void quantize_rows_to_quads(const float* x, int64_t k, int64_t rows,
                                                    uint32_t* dst, float* row_scales) {
  alignas(16) uint32_t words[4];
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * k;
    __m512 top = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
      const __mmask16 m = _cvtu32_mask16(k - i >= 16 ? 0xffffu : (1u << (k - i)) - 1);
      top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, xr + i)));
    }
    const float amax = _mm512_reduce_max_ps(top);
    // An all-zero row: every q is 0, and its outputs are the bias.
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    row_scales[t] = amax / 127.f;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m128i bias = _mm_set1_epi8(static_cast<char>(0x80));
    for (int64_t i = 0; i < k; i += 16) {
      const int64_t left = std::min<int64_t>(k - i, 16);
      const __mmask16 m = _cvtu32_mask16(left >= 16 ? 0xffffu : (1u << left) - 1);
      // Round to nearest even (the default MXCSR mode), then saturate: |x · inv| <= 127 up to
      // the product's rounding, which can only reach 127.00002 and rounds back to 127.
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), vinv));
      _mm_store_si128(reinterpret_cast<__m128i*>(words),
                      _mm_xor_si128(_mm512_cvtsepi32_epi8(q), bias));
      for (int64_t w = 0; w < (left + 3) / 4; ++w) dst[(i / 4 + w) * rows + t] = words[w];
    }
  }
}

template <int T, int P>
constexpr TileSet<uint32_t, int8_t>::Full pick_tile() {
  if constexpr (T * P + P + 2 <= 32)  // accumulators, weights, a broadcast and the permutation
    return tile_quads<T, P>;
  else
    return nullptr;
}

template <int T>
constexpr void fill_row(TileSet<uint32_t, int8_t>& s) {
  s.full[T][0] = pick_tile<T, kPanelChoices[0]>();
  s.full[T][1] = pick_tile<T, kPanelChoices[1]>();
  s.full[T][2] = pick_tile<T, kPanelChoices[2]>();
  s.full[T][3] = pick_tile<T, kPanelChoices[3]>();
  s.full[T][4] = pick_tile<T, kPanelChoices[4]>();
  s.full[T][5] = pick_tile<T, kPanelChoices[5]>();
  s.narrow[T] = narrow_tile_quads<T>;
}

template <int... T>
constexpr TileSet<uint32_t, int8_t> make_tiles(std::integer_sequence<int, T...>) {
  TileSet<uint32_t, int8_t> s{};
  (fill_row<T + 1>(s), ...);
  return s;
}
constexpr TileSet<uint32_t, int8_t> kQuadTiles =
    make_tiles(std::make_integer_sequence<int, kMaxTileRows>{});

// 128 · Σᵢ w[o][i] for each output o of a panel16-packed i8 matrix [m, k] (rounded up to whole
// panels, the padding zero): one pass over the weights when the kernel is prepared (bloom-560m's
// 257 MB lm_head included), sixteen outputs at a time.
KILN_TARGET_AVX512_VNNI std::vector<int32_t> shift_sums(const int8_t* w, int64_t m, int64_t k) {
  std::vector<int32_t> sums(static_cast<size_t>((m + kPanelRows - 1) / kPanelRows * kPanelRows));
  for (int64_t p0 = 0; p0 < m; p0 += kPanelRows) {
    const int64_t width = std::min(kPanelRows, m - p0);
    const int8_t* panel = w + p0 * k;
    if (width < kPanelRows) {
      for (int64_t i = 0; i < k; ++i)
        for (int64_t r = 0; r < width; ++r) sums[p0 + r] += 128 * panel[i * width + r];
      continue;
    }
    __m512i acc = _mm512_setzero_si512();
    for (int64_t i = 0; i < k; ++i)
      acc = _mm512_add_epi32(acc, _mm512_cvtepi8_epi32(_mm_loadu_si128(
                                      reinterpret_cast<const __m128i*>(panel + i * kPanelRows))));
    _mm512_storeu_si512(sums.data() + p0, _mm512_slli_epi32(acc, 7));
  }
  return sums;
}

class VnniLinear final : public Kernel {
 public:
  explicit VnniLinear(const Node& node) : node_(node) {}

  void prepare(const Graph& graph) override {
    x_shape_ = graph.values[node_.inputs[0]].shape;
    weight_ = panel16_weight(graph, node_);
    KILN_CHECK(weight_.dtype() == DType::kI8,
               "node '{}': the AVX512-VNNI Linear takes i8 weights, not {}", node_.name,
               dtype_name(weight_.dtype()));
    shift_sums_ =
        shift_sums(static_cast<const int8_t*>(weight_.raw()), weight_.dim(0), weight_.dim(1));
  }

  // The quantized rows (ceil(k / 4) words each) and one scale per row.
  int64_t workspace_bytes(const Bindings& bindings) const override {
    const Shape shape = resolve_shape(x_shape_, bindings);
    int64_t elems = 1;
    for (int64_t d : shape) elems *= d;
    const int64_t k = shape.empty() ? 1 : std::max<int64_t>(shape.back(), 1);
    const int64_t rows = elems / k;
    return rows * ((k + 3) / 4 + 1) * static_cast<int64_t>(sizeof(uint32_t));
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
    const int64_t n = x.numel() / k, quads = (k + 3) / 4;
    std::vector<uint32_t> own;  // callers without a workspace (micro-benchmarks)
    std::vector<float> own_scales;
    uint32_t* xt;
    float* row_scales;
    if (args.scratch != nullptr) {
      xt = static_cast<uint32_t*>(args.scratch);
      row_scales = static_cast<float*>(static_cast<void*>(xt + n * quads));
    } else {
      own.resize(static_cast<size_t>(n * quads));
      own_scales.resize(static_cast<size_t>(n));
      xt = own.data();
      row_scales = own_scales.data();
    }
    const Epilogue e{args.out[0].data<float>(), m, scales, bias, nullptr, shift_sums_.data()};
    const Staging<uint32_t> staging{quantize_rows_to_quads, quads, row_scales};
    run_packed_linear(x.data<float>(), n, k, static_cast<const int8_t*>(weight_.raw()), m, e,
                      node_.attr<LinearAttrs>().activation, xt, staging, kQuadTiles, *args.pool);
  }

 private:
  const Node& node_;
  SymShape x_shape_;
  Tensor weight_;                    // panel16: the plan's mapping, or packed here
  std::vector<int32_t> shift_sums_;  // [m rounded up to 16]: 128 · Σᵢ w[o][i]
};

}  // namespace

KernelFactory packed_int8_dot_linear_factory() {
  return [](const Node& n) { return std::make_unique<VnniLinear>(n); };
}

}  // namespace kiln::cpu
