// What kiln's quantized GEMVs share (gemv_i8.cu, gemv_w8a8.cu): each warp holds the sums of a
// group of features for a slice of rows; they are reduced across its lanes and across the warps
// that split the group, one lane stores each sum, and the host launches a step's rows as full
// slices plus one shorter rest.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {

// Sums every slot of acc over the warp's lanes and, with split > 1, over the `split` consecutive
// warps sharing a feature group (through `partial`, the block's shared [warps][slots][rows]), in
// a fixed order. Returns false for the warps that leave the rest to their group's first (sub !=
// 0); that one then holds the totals.
template <typename Acc, int kWarps, int kSlots, int N>
__device__ __forceinline__ bool reduce_feature_group(Acc (&acc)[kSlots][N],
                                                     Acc (&partial)[kWarps][kSlots][N], int warp,
                                                     int lane, int sub, int split) {
#pragma unroll
  for (int k = 0; k < kSlots; ++k)
#pragma unroll
    for (int r = 0; r < N; ++r) acc[k][r] = warp_sum(acc[k][r]);
  if (split > 1) {
    if (lane == 0)
#pragma unroll
      for (int k = 0; k < kSlots; ++k)
#pragma unroll
        for (int r = 0; r < N; ++r) partial[warp][k][r] = acc[k][r];
    __syncthreads();
    if (sub != 0) return false;
#pragma unroll
    for (int k = 0; k < kSlots; ++k)
#pragma unroll
      for (int r = 0; r < N; ++r) {
        Acc s = 0;
        for (int p = 0; p < split; ++p) s += partial[warp + p][k][r];
        acc[k][r] = s;
      }
  }
  return true;
}

// acc[kk][rr] for kk < kFeatures: the sum a storing lane writes, selected without indexing the
// register array dynamically.
template <int kFeatures, typename Acc, int kSlots, int N>
__device__ __forceinline__ Acc lane_sum(const Acc (&acc)[kSlots][N], int kk, int rr) {
  Acc v = 0;
#pragma unroll
  for (int k = 0; k < kFeatures; ++k)
#pragma unroll
    for (int r = 0; r < N; ++r)
      if (k == kk && r == rr) v = acc[k][r];
  return v;
}

namespace gemv_detail {
template <int N, int kSliceRows, typename F>
void launch_rest(int64_t rest, int64_t base, F& launch_slices) {
  if constexpr (N < kSliceRows) {
    if (rest == N) return launch_slices(std::integral_constant<int, N>{}, base, 1u);
    launch_rest<N + 1, kSliceRows>(rest, base, launch_slices);
  }
}
}  // namespace gemv_detail

// Launches a step of `rows` rows: the full slices of kSliceRows rows in one launch (the grid's y
// dimension), then the rest in one of its own, as launch_slices(std::integral_constant<int, N>,
// row_base, slices).
template <int kSliceRows, typename F>
void launch_row_slices(int64_t rows, F&& launch_slices) {
  const int64_t full = rows / kSliceRows, rest = rows % kSliceRows;
  if (full > 0)
    launch_slices(std::integral_constant<int, kSliceRows>{}, int64_t{0},
                  static_cast<unsigned>(full));
  gemv_detail::launch_rest<1, kSliceRows>(rest, full * kSliceRows, launch_slices);
}

}  // namespace kiln::cuda
