// The int4-weight Linear of the AVX2 family: plain i4 weights (graph/linear.h: row-major, two a
// byte, f16 scales per output and group of 128 inputs), activations quantized to int8 in groups
// of 128 by the AVX-512 family's definition (packed_linear.h: quantize_rows_to_quads; the same
// bytes, here in scalar code: a row's quantization is O(k) against the product's O(k · m)),
// integer dot products, at every row count (prefill too: no widened copy for a GEMM library).
//
// One 16-byte load of an i4 row holds 32 consecutive weights, the even ones in its low nibbles
// and the odd ones in its high nibbles; the activation rows are stored per block of 32 in that
// order (the 16 even elements, then the 16 odd ones), so that the weights need no shuffle: a
// xor with 0x88 (u = q + 8, unsigned), a shift of a copy, one insert and one mask give 32 u8
// weights against 32 s8 activations. vpmaddubsw sums products in pairs (at most 2 · 15 · 127,
// no saturation) into int16 lanes, four blocks (a group of 128) add up to at most 15,240, then
// vpmaddwd widens them to int32: the integer sums are exact, the same integers the AVX-512
// family computes. Per group and output:
//   y[t][o] += f32(Σ q_x · u − 8 · Σ q_x) · (scale_w[o][g] · a[t][g])   (eight f32 lanes),
// the lanes summed in a fixed order at the end, + bias. Each row's result depends on that row
// alone: bit-identical alone and in any batch.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/vector_math.h"
#include "core/half.h"
#include "graph/linear.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kBlock = 32;  // activations a 16-byte weight load covers
constexpr int64_t kBlocksPerGroup = kInt4Group / kBlock;  // 4
constexpr int64_t kOutputBlock = 16;                      // outputs per parallel work item

// One activation group's scale and the sums' shift (8 · Σ q over the group).
struct RowGroup {
  float scale;
  int32_t shift;
};

// x [k] -> q [kp] int8 (kp: k rounded up to whole blocks, zero past k), each block of 32 stored
// as its even elements then its odd ones, and the row's groups of kInt4Group: a = max|x| / 127,
// q = x · (127 / max|x|) rounded to nearest even (the AVX-512 family's definition, bit for bit).
void quantize_row(const float* x, int64_t k, int8_t* q, int64_t kp, RowGroup* groups) {
  std::fill(q, q + kp, int8_t{0});
  for (int64_t g0 = 0; g0 < k; g0 += kInt4Group) {
    const int64_t g1 = std::min(k, g0 + kInt4Group);
    float amax = 0.f;
    for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int32_t total = 0;
    for (int64_t i = g0; i < g1; ++i) {
      const auto v = static_cast<int32_t>(std::nearbyint(x[i] * inv));
      total += v;
      const int64_t b = i / kBlock * kBlock, e = i - b;
      q[b + (e % 2) * 16 + e / 2] = static_cast<int8_t>(v);
    }
    groups[g0 / kInt4Group] = {amax / 127.f, 8 * total};
  }
}

// 32 weights of row w from element i (a multiple of 32) as u8 = q + 8 in the activations' block
// order; past k (the row's last, partial block) zeros, which meet zero activations.
inline __m256i load_block(const uint8_t* w, int64_t i, int64_t k) {
  __m128i raw;
  if (i + kBlock <= k) {
    raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i / 2));
  } else {
    alignas(16) uint8_t tail[16] = {};
    std::copy(w + i / 2, w + k / 2, tail);
    raw = _mm_load_si128(reinterpret_cast<const __m128i*>(tail));
  }
  raw = _mm_xor_si128(raw, _mm_set1_epi8(static_cast<char>(0x88)));
  const __m256i both =
      _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// T rows of quantized activations (q[t], groups g[t]) × four weight rows w[f] with their f16
// group scales s[f] -> out[t][f] (before the bias). `prefetch`: the first row tile of a work
// item, whose weights stream from memory; the next four rows follow these four.
template <int T>
void tile_i4(const int8_t* const* q, const RowGroup* const* g, const uint8_t* const w[4],
             const uint16_t* const s[4], int64_t k, bool prefetch, float out[][4]) {
  const int64_t blocks = (k + kBlock - 1) / kBlock, groups = int4_groups(k);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 sum[T][4];
  for (int t = 0; t < T; ++t)
    for (int f = 0; f < 4; ++f) sum[t][f] = _mm256_setzero_ps();
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t b0 = gi * kBlocksPerGroup, b1 = std::min(blocks, b0 + kBlocksPerGroup);
    __m256i acc[T][4];
    for (int t = 0; t < T; ++t)
      for (int f = 0; f < 4; ++f) acc[t][f] = _mm256_setzero_si256();
    for (int64_t b = b0; b < b1; ++b) {
      if (prefetch)
        _mm_prefetch(reinterpret_cast<const char*>(w[0] + 4 * (k / 2) + b * kBlock / 2),
                     _MM_HINT_T0);
#pragma GCC unroll 4
      for (int f = 0; f < 4; ++f) {
        const __m256i wv = load_block(w[f], b * kBlock, k);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t)
          acc[t][f] = _mm256_add_epi16(
              acc[t][f],
              _mm256_maddubs_epi16(
                  wv, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[t] + b * kBlock))));
      }
    }
    for (int f = 0; f < 4; ++f) {
      const float ws = fp16_to_float(s[f][gi]);
      for (int t = 0; t < T; ++t) {
        const RowGroup& rg = g[t][gi];
        const __m256i v = _mm256_sub_epi32(_mm256_madd_epi16(acc[t][f], ones),
                                           _mm256_setr_epi32(rg.shift, 0, 0, 0, 0, 0, 0, 0));
        sum[t][f] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(ws * rg.scale), sum[t][f]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int f = 0; f < 4; ++f) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, sum[t][f]);
      out[t][f] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                  ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
}

}  // namespace

// x [n, k] f32, w [m, k] i4, bias [m] (optional), scales [m, groups] f16 -> [n, m]
// (+ fused activation)
void linear_i4_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                    const KernelEnv& env) {
  const Tensor& x = *linear_input(in, LinearOperand::kX);
  const Tensor& w = *linear_input(in, LinearOperand::kWeight);
  const Tensor* bias = linear_input(in, LinearOperand::kBias);
  const Tensor* scales = linear_input(in, LinearOperand::kWeightScales);
  KILN_CHECK(x.dtype() == DType::kF32 && out[0].dtype() == DType::kF32,
             "node '{}': this cpu Linear takes and returns f32 activations", node.name);
  KILN_CHECK(w.dtype() == DType::kI4 && scales != nullptr && scales->dtype() == DType::kF16,
             "node '{}': an i4 weight needs its f16 group scales", node.name);
  const int64_t m = w.dim(0), k = w.dim(1), groups = int4_groups(k);
  KILN_CHECK(scales->rank() == 2 && scales->dim(0) == m && scales->dim(1) == groups,
             "node '{}': group scales {} for an i4 weight [{}, {}]", node.name,
             shape_str(scales->shape()), m, k);
  const int64_t n = x.numel() / k, kp = (k + kBlock - 1) / kBlock * kBlock;
  const float* xp = x.data<float>();
  std::vector<int8_t> q(static_cast<size_t>(n * kp));
  std::vector<RowGroup> row_groups(static_cast<size_t>(n * groups));
  env.pool.parallel_for(n, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      quantize_row(xp + t * k, k, q.data() + t * kp, kp, row_groups.data() + t * groups);
  });
  const auto* wp = static_cast<const uint8_t*>(w.raw());
  const auto* sp = static_cast<const uint16_t*>(scales->raw());
  const float* bp = bias != nullptr ? bias->data<float>() : nullptr;
  float* yp = out[0].data<float>();
  const std::optional<Activation> act = node.attr<LinearAttrs>().epilogue.activation;
  env.pool.parallel_for((m + kOutputBlock - 1) / kOutputBlock, 1, [&](int64_t b0, int64_t b1) {
    float totals[2][4];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kOutputBlock, o1 = std::min(m, o0 + kOutputBlock);
      for (int64_t o = o0; o < o1; o += 4) {
        // Rows past the end repeat the last one (their results are dropped).
        const uint8_t* rows[4];
        const uint16_t* row_scales[4];
        for (int f = 0; f < 4; ++f) {
          const int64_t r = std::min(o + f, o1 - 1);
          rows[f] = wp + r * (k / 2);
          row_scales[f] = sp + r * groups;
        }
        const int64_t live = std::min<int64_t>(4, o1 - o);
        for (int64_t t = 0; t < n;) {
          const int tn = t + 1 < n ? 2 : 1;
          const int8_t* qs[2] = {q.data() + t * kp, q.data() + (t + tn - 1) * kp};
          const RowGroup* gs[2] = {row_groups.data() + t * groups,
                                   row_groups.data() + (t + tn - 1) * groups};
          if (tn == 2)
            tile_i4<2>(qs, gs, rows, row_scales, k, t == 0, totals);
          else
            tile_i4<1>(qs, gs, rows, row_scales, k, t == 0, totals);
          store_linear_tile(yp, m, t, tn, o, live, nullptr, bp,
                            [&](int j, int64_t f) { return totals[j][f]; });
          t += tn;
        }
      }
      if (act)
        for (int64_t t = 0; t < n; ++t)
          apply_activation(*act, yp + t * m + o0, yp + t * m + o0, o1 - o0);
    }
  });
}

}  // namespace kiln::cpu
