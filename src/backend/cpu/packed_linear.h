// The machinery every AVX-512 Linear over panel16-packed weights shares (kernels_packed.cc: f32
// FMAs and bf16 dot products; kernels_vnni.cc: int8 dot products; kernels_int4.cc: i4 weights in
// panel16q4): the epilogue a tile writes its outputs through, the tile table, the queue of panel
// groups, the driver that stages the activation rows and runs every row tile over each group of
// panels while its weights are in cache, and the dynamic int8 quantization of activation rows the
// integer families share. Internal to the CPU backend.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "backend/cpu/vector_math.h"
#include "backend/kernel.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "graph/ir.h"
#include "graph/packing.h"

namespace kiln::cpu::packed {

#define KILN_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// One group of a quantized activation row (int8 dot products, kernels_vnni.cc and
// kernels_int4.cc): its scale, and what the weights' shift to unsigned added to each of its sums
// (offset · Σ q over the group: 128 for i8 weights, 8 for i4).
struct GroupQuant {
  float scale;
  int32_t shift;
};

// Activation elements per dynamic quantization group (int8-weight and int4-weight dot products).
constexpr int64_t kActGroup = 128;

// Rows [0, rows) of x [rows, k] quantized into dst as interleaved quads of s8 (quad iq of row t
// at dst[iq·rows + t]; a partial last quad is padded with zeros, and then whole zero quads up to
// a multiple of QuadMultiple), in groups of kActGroup elements whose scales and shifts (Offset ·
// Σ q) go to groups[t·ceil(k / kActGroup) + g]. A group's scale a = max|x| / 127 over the group,
// q = x · (127 / max|x|) rounded to nearest even. A row's bytes and groups depend on that row
// alone.
// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as
// "(maybe) uninitialized" once they inline here (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
template <int32_t Offset, int64_t QuadMultiple>
KILN_TARGET_AVX512 void quantize_rows_to_quads(const float* x, int64_t k, int64_t rows,
                                               uint32_t* dst, GroupQuant* groups, float /*scale*/) {
  const int64_t per_row = (k + kActGroup - 1) / kActGroup, quads = (k + 3) / 4;
  const int64_t padded = (quads + QuadMultiple - 1) / QuadMultiple * QuadMultiple;
  alignas(16) uint32_t words[4];
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * k;
    for (int64_t g0 = 0; g0 < k; g0 += kActGroup) {
      const int64_t g1 = std::min(k, g0 + kActGroup);
      __m512 top = _mm512_setzero_ps();
      for (int64_t i = g0; i < g1; i += 16) {
        const __mmask16 m = _cvtu32_mask16(g1 - i >= 16 ? 0xffffu : (1u << (g1 - i)) - 1);
        top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, xr + i)));
      }
      const float amax = _mm512_reduce_max_ps(top);
      // An all-zero group: every q is 0 and it adds nothing.
      const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      __m512i total = _mm512_setzero_si512();
      for (int64_t i = g0; i < g1; i += 16) {
        const int64_t left = std::min<int64_t>(g1 - i, 16);
        const __mmask16 m = _cvtu32_mask16(left >= 16 ? 0xffffu : (1u << left) - 1);
        // Round to nearest even (the default MXCSR mode), then saturate: |x · inv| <= 127 up to
        // the product's rounding, which can only reach 127.00002 and rounds back to 127.
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv));
        total = _mm512_add_epi32(total, q);
        _mm_store_si128(reinterpret_cast<__m128i*>(words), _mm512_cvtsepi32_epi8(q));
        for (int64_t w = 0; w < (left + 3) / 4; ++w) dst[(i / 4 + w) * rows + t] = words[w];
      }
      groups[t * per_row + g0 / kActGroup] = {amax / 127.f,
                                              Offset * _mm512_reduce_add_epi32(total)};
    }
    for (int64_t w = quads; w < padded; ++w) dst[w * rows + t] = 0;
  }
}
#pragma GCC diagnostic pop

// The workspace of a family that quantizes its rows: `rows` rows of `words` u32 each, then their
// `groups_per_row` groups each.
inline int64_t quantized_rows_bytes(int64_t rows, int64_t words, int64_t groups_per_row) {
  return rows * (words * static_cast<int64_t>(sizeof(uint32_t)) +
                 groups_per_row * static_cast<int64_t>(sizeof(GroupQuant)));
}
// The rows and width of a Linear's input [..., k] under `bindings`.
struct InputRows {
  int64_t rows, k;
};
inline InputRows input_rows(const SymShape& x_shape, const Bindings& bindings) {
  const Shape shape = resolve_shape(x_shape, bindings);
  int64_t elems = 1;
  for (int64_t d : shape) elems *= d;
  const int64_t k = shape.empty() ? 1 : std::max<int64_t>(shape.back(), 1);
  return {elems / k, k};
}
// Where a call's quantized rows go: the kernel's workspace (64-byte aligned; the groups follow
// the words), or buffers of its own for callers without one (micro-benchmarks).
class QuantizedRows {
 public:
  QuantizedRows(void* scratch, int64_t rows, int64_t words, int64_t groups_per_row) {
    if (scratch != nullptr) {
      words_ = static_cast<uint32_t*>(scratch);
      groups_ = static_cast<GroupQuant*>(static_cast<void*>(words_ + rows * words));
      return;
    }
    own_.resize(static_cast<size_t>(rows * words));
    own_groups_.resize(static_cast<size_t>(rows * groups_per_row));
    words_ = own_.data();
    groups_ = own_groups_.data();
  }
  QuantizedRows(const QuantizedRows&) = delete;
  QuantizedRows& operator=(const QuantizedRows&) = delete;
  uint32_t* words() const { return words_; }
  GroupQuant* groups() const { return groups_; }

 private:
  uint32_t* words_ = nullptr;
  GroupQuant* groups_ = nullptr;
  std::vector<uint32_t> own_;
  std::vector<GroupQuant> own_groups_;
};

// What a tile writes its outputs through: rows of y, and the per-output scales and bias.
struct Epilogue {
  float* y;
  int64_t ldy;
  const float* scales;  // null unless i8
  const float* bias;    // null when absent
  // Int8 dot products only: the tile's rows' groups (group g of row t at groups[t·per_row + g]).
  const GroupQuant* groups = nullptr;
  int64_t groups_per_row = 0;
  // i4 weights only: their f16 group scales [m, groups_per_row], panel16-packed.
  const uint16_t* group_scales = nullptr;
};

KILN_TARGET_AVX512 inline __m512 finish(__m512 acc, const Epilogue& e, int64_t o) {
  if (e.scales) acc = _mm512_mul_ps(acc, _mm512_loadu_ps(e.scales + o));
  if (e.bias) acc = _mm512_add_ps(acc, _mm512_loadu_ps(e.bias + o));
  return acc;
}

// A tile's T rows of P full panels, through the epilogue, into y (every tile family).
template <int T, int P>
KILN_TARGET_AVX512 inline void store_tile(const __m512 (&acc)[T][P], int64_t o, const Epilogue& e) {
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p)
      _mm512_storeu_ps(e.y + t * e.ldy + o + p * kPanelRows,
                       finish(acc[t][p], e, o + p * kPanelRows));
}

// A narrow last panel's T rows: its `width` < 16 outputs scaled, biased and stored one by one.
template <int T>
KILN_TARGET_AVX512 inline void store_narrow(const __m512 (&acc)[T], int64_t o, int64_t width,
                                            const Epilogue& e) {
  alignas(64) float out[kPanelRows];
  for (int t = 0; t < T; ++t) {
    _mm512_store_ps(out, acc[t]);
    for (int64_t j = 0; j < width; ++j) {
      float v = out[j];
      if (e.scales) v *= e.scales[o + j];
      if (e.bias) v += e.bias[o + j];
      e.y[t * e.ldy + o + j] = v;
    }
  }
}

constexpr int64_t kPrefetchBytes = 2048;
// The dot-product tiles at many rows spend ~12 cycles on each line of their panels, and reach
// the memory's rate only with twice the distance (kiln_linear_bench, 16 × 1024 × 62720: 565 ->
// 595 GFLOP/s; 8 KB was no better).
constexpr int64_t kDotPrefetchBytes = 4096;

// Panels per tile for T rows: as many as the 32 vector registers hold (T·P accumulators, P
// weights, one broadcast), and at least 8 independent chains for a single row so that the
// fused-multiply-add latency does not cap the speed at which the weights stream.
constexpr int panels_for(int rows) {
  return rows == 1    ? 4
         : rows == 2  ? 8
         : rows == 3  ? 6
         : rows <= 6  ? 4
         : rows <= 9  ? 3
         : rows <= 14 ? 2
                      : 1;
}
// Rows per tile at most. (16-row dot-product tiles of one panel, which use each weight line
// for every row as it streams in, were slower: kiln_linear_bench 16 × 1024 × 62720 540 against
// 584 GFLOP/s for two 8-row tiles of 3 panels.)
constexpr int kMaxTileRows = 8;

// Every (rows, panels) tile a call can use: a call picks P = panels_for(its tile rows), and its
// last row tile may be shorter than the others with the same P.
constexpr int kPanelChoices[] = {1, 2, 3, 4, 6, 8};
constexpr int kNumPanelChoices = 6;
constexpr int panel_choice(int panels) {
  return panels == 1   ? 0
         : panels == 2 ? 1
         : panels == 3 ? 2
         : panels == 4 ? 3
         : panels == 6 ? 4
                       : 5;
}

// A constant operand `v` of `node` in `layout`: the plan's mapping when it is stored so already,
// else packed here once (a plain plan, or one built in memory): pack(plain, out) fills `out`, a
// new tensor of `dtype` and `shape`, from v's data made contiguous.
template <class Pack>
Tensor packed_or_pack(const Node& node, const Value& v, const WeightLayout& layout, DType dtype,
                      const Shape& shape, Pack&& pack) {
  if (v.layout == layout) return v.data;
  KILN_CHECK(v.layout.plain(), "node '{}': '{}' is packed as {} for {}", node.name, v.name,
             v.layout.packing, v.layout.target);
  const Tensor plain = v.data.is_contiguous() ? v.data : v.data.clone();
  Tensor out = Tensor::empty(dtype, shape);
  pack(plain, out);
  return out;
}

// The panel16 form of a Linear node's weight (input 1): the plan's mapping when it is packed
// already, else packed here once (a plain plan, or one built in memory).
Tensor panel16_weight(const Graph& graph, const Node& node);

// X: the activations as the tiles read them; W: one weight element.
template <class X, class W>
struct TileSet {
  using Full = void (*)(const X*, int64_t, const W*, const W*, int64_t, int64_t, const Epilogue&);
  using Narrow = void (*)(const X*, int64_t, const W*, int64_t, int64_t, int64_t, const Epilogue&);
  Full full[kMaxTileRows + 1][kNumPanelChoices];  // [rows][panel_choice(P)]
  Narrow narrow[kMaxTileRows + 1];
  // W units a packed weight row of k elements takes (panels start 16 such rows apart); null: k.
  int64_t (*row_units)(int64_t k) = nullptr;
};

// A family's TileSet from its tiles: Family::full<T, P>() for T rows × P panels (null where the
// tile does not fit the registers: run_packed_linear calls only T × panels_for(T), and single
// panels), Family::narrow<T>(), and Family::row_units where the family has one.
template <class Family, int R, int... C>
constexpr void fill_tile_row(TileSet<typename Family::X, typename Family::W>& s,
                             std::integer_sequence<int, C...>) {
  ((s.full[R][C] = Family::template full<R, kPanelChoices[C]>()), ...);
  s.narrow[R] = Family::template narrow<R>();
}
template <class Family, int... R>
constexpr TileSet<typename Family::X, typename Family::W> make_tile_set(
    std::integer_sequence<int, R...>) {
  TileSet<typename Family::X, typename Family::W> s{};
  (fill_tile_row<Family, R + 1>(s, std::make_integer_sequence<int, kNumPanelChoices>{}), ...);
  if constexpr (requires { Family::row_units; }) s.row_units = Family::row_units;
  return s;
}
template <class Family>
constexpr TileSet<typename Family::X, typename Family::W> tile_set() {
  return make_tile_set<Family>(std::make_integer_sequence<int, kMaxTileRows>{});
}

// The line a dot-product tile requests at step `step` of the `steps` it takes through each panel
// (one `line`-unit line of every panel a step): `ahead` steps on, then on into `next` (the
// thread's next group of panels), or this step's own line when there is none.
template <class W>
inline const W* line_ahead(const W* w, const W* next, int64_t step, int64_t steps, int64_t ahead,
                           int64_t line) {
  const int64_t a = step + ahead;
  return a < steps ? w + a * line : next != nullptr ? next + (a - steps) * line : w + step * line;
}

// The groups of panels of one call, handed to the pool's threads: each thread owns an equal
// contiguous range and takes groups from its front (one stream through memory); a thread whose
// range is empty takes the last group of another thread's range. On this shared VM the two
// cores' speeds differ from call to call, and a static split left the faster one waiting up to
// 10 % of a decode Linear. Which thread computes a group never changes its results.
class GroupQueue {
 public:
  struct Take {
    int64_t group;  // -1: nothing left
    int64_t next;   // the group this thread will probably take next (to prefetch), or -1
  };
  GroupQueue(int64_t groups, int threads)
      : workers_(static_cast<int>(std::clamp<int64_t>(groups, 1, threads))),
        ranges_(std::make_unique<Range[]>(static_cast<size_t>(workers_))) {
    for (int w = 0; w < workers_; ++w) {
      const int64_t b = groups * w / workers_, e = groups * (w + 1) / workers_;
      ranges_[w].front_back.store(pack(b, e), std::memory_order_relaxed);
    }
  }
  int workers() const { return workers_; }

  Take take(int64_t worker) {
    Range& own = ranges_[worker];
    for (uint64_t v = own.front_back.load(); front(v) < back(v);)
      if (own.front_back.compare_exchange_weak(v, pack(front(v) + 1, back(v))))
        return {front(v), front(v) + 1 < back(v) ? front(v) + 1 : -1};
    for (int d = 1; d < workers_; ++d) {
      Range& other = ranges_[(worker + d) % workers_];
      for (uint64_t v = other.front_back.load(); front(v) < back(v);)
        if (other.front_back.compare_exchange_weak(v, pack(front(v), back(v) - 1)))
          return {back(v) - 1, back(v) - 2 >= front(v) ? back(v) - 2 : -1};
    }
    return {-1, -1};
  }

 private:
  struct alignas(64) Range {
    std::atomic<uint64_t> front_back{0};  // [front, back) of the groups not yet taken
  };
  static uint64_t pack(int64_t f, int64_t b) {
    return static_cast<uint64_t>(f) << 32 | static_cast<uint32_t>(b);
  }
  static int64_t front(uint64_t v) { return static_cast<int64_t>(v >> 32); }
  static int64_t back(uint64_t v) { return static_cast<int64_t>(v & 0xffffffffu); }

  int workers_;
  std::unique_ptr<Range[]> ranges_;
};

// How a family reads its activation rows. `stage` null: f32 rows, interleaved into xt when
// there are several (a single row is read in place). Otherwise stage(x, k, rows, dst, groups,
// scale) converts `rows` rows of x [rows, k] into dst, `per_row` X a row, interleaved (element i
// of row t at dst[i·rows + t]), and may record `groups_per_row` quantization groups a row;
// `scale` is a static quantization scale (W8A8's input scale), 0 for families without one.
template <class X>
struct Staging {
  void (*stage)(const float* x, int64_t k, int64_t rows, X* dst, GroupQuant* groups,
                float scale) = nullptr;
  int64_t per_row = 0;           // X per row in xt
  GroupQuant* groups = nullptr;  // [n · groups_per_row] when the family quantizes
  int64_t groups_per_row = 0;
  float scale = 0.0f;
};

// x [n, k], w [m, k] packed, y [n, m]: rows in tiles of up to kMaxTileRows, spread evenly; each
// thread takes groups of panels from a GroupQueue and runs every row tile over a group while its
// weights are in cache. Several rows are first interleaved into `xt`, tile by tile (element i of
// a tile's row t at i·rows + t): rows k floats apart would all fall into the same L1 sets (k a
// multiple of 1024), which at 16 rows made the broadcasts miss L1 every time. Staged families
// convert every row, a single one too, into xt.
template <class X, class W>
void run_packed_linear(const float* xp, int64_t n, int64_t k, const W* wp, int64_t m,
                       const Epilogue& e, std::optional<Activation> act, X* xt,
                       const Staging<X>& staging, const TileSet<X, W>& tiles, ThreadPool& pool) {
  const bool staged = staging.stage != nullptr;
  const int64_t row_tiles = (n + kMaxTileRows - 1) / kMaxTileRows;
  const int tile_rows = static_cast<int>((n + row_tiles - 1) / row_tiles);
  const int64_t xk = staged ? staging.per_row : k;  // elements of xt per row
  auto stage_tiles = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t0 = r * tile_rows, rows = std::min<int64_t>(tile_rows, n - t0);
      X* dst = xt + t0 * xk;
      if (staged) {
        staging.stage(
            xp + t0 * k, k, rows, dst,
            staging.groups != nullptr ? staging.groups + t0 * staging.groups_per_row : nullptr,
            staging.scale);
      } else if constexpr (std::is_same_v<X, float>) {
        for (int64_t t = 0; t < rows; ++t)
          for (int64_t i = 0; i < k; ++i) dst[i * rows + t] = xp[(t0 + t) * k + i];
      }
    }
  };
  if (n > 1 || staged) pool.parallel_for(row_tiles, 1, stage_tiles);  // one tile: inline
  const int group = panels_for(tile_rows);
  const int64_t kw = tiles.row_units != nullptr ? tiles.row_units(k) : k;  // W units a row
  const int64_t panels = (m + kPanelRows - 1) / kPanelRows;
  const int64_t groups = (panels + group - 1) / group;
  GroupQueue queue(groups, pool.size());
  pool.parallel_for(queue.workers(), 1, [&](int64_t w0, int64_t w1) {
    for (int64_t worker = w0; worker < w1; ++worker)
      for (GroupQueue::Take g = queue.take(worker); g.group >= 0; g = queue.take(worker)) {
        const int64_t p0 = g.group * group, p1 = std::min(panels, p0 + group);
        const bool whole = p1 - p0 == group && p1 * kPanelRows <= m;
        const W* next =
            g.next >= 0 && g.next < groups ? wp + g.next * group * kPanelRows * kw : nullptr;
        for (int64_t t = 0; t < n; t += tile_rows) {
          const int rows = static_cast<int>(std::min<int64_t>(tile_rows, n - t));
          const X* x;
          if (staged || n > 1)
            x = xt + t * xk;
          else if constexpr (std::is_same_v<X, float>)
            x = xp;
          else
            x = nullptr;  // unstaged rows are f32
          const int64_t ldx = n > 1 ? rows : 1;
          Epilogue et = e;
          et.y = e.y + t * e.ldy;
          if (staging.groups != nullptr) {
            et.groups = staging.groups + t * staging.groups_per_row;
            et.groups_per_row = staging.groups_per_row;
          }
          if (whole) {
            // Later row tiles of this group find its weights in cache; the last one streams on.
            tiles.full[rows][panel_choice(group)](x, ldx, wp + p0 * kPanelRows * kw,
                                                  t + rows < n ? nullptr : next, k, p0 * kPanelRows,
                                                  et);
            continue;
          }
          for (int64_t p = p0; p < p1; ++p) {
            const int64_t o = p * kPanelRows, width = std::min(kPanelRows, m - o);
            if (width == kPanelRows)
              tiles.full[rows][0](x, ldx, wp + o * kw, nullptr, k, o, et);
            else
              tiles.narrow[rows](x, ldx, wp + o * kw, k, o, width, et);
          }
        }
        if (act) {
          const int64_t o0 = p0 * kPanelRows, o1 = std::min(m, p1 * kPanelRows);
          for (int64_t t = 0; t < n; ++t)
            apply_activation_avx512(*act, e.y + t * e.ldy + o0, e.y + t * e.ldy + o0, o1 - o0);
        }
      }
  });
}

}  // namespace kiln::cpu::packed
