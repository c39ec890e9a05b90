// HuggingFace's logits processors on the device (TokenSelector::edit_logits_rows): one block per
// edited row, in RowEdit's order (log-softmax, repetition penalty, bans, forced ids, suppressed
// ids), so that the argmax and top-k kernels after it choose from the processed row and no row
// crosses to the host.
#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {
namespace {

constexpr int kEditThreads = 256;

__device__ __forceinline__ void set_ids(float* row, const long long* ids, int begin, int end,
                                        float value) {
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += blockDim.x) row[ids[i]] = value;
}

__global__ void edit_logits_kernel(float* x, int64_t cols, const LogitEdit* edits,
                                   const long long* ids) {
  pdl_begin();
  const LogitEdit e = edits[blockIdx.x];
  float* row = x + e.row * cols;
  if (e.log_softmax) {
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, row[c]);
    mx = block_max(mx);
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(row[c] - mx);
    const float lse = mx + logf(block_sum(sum));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c] -= lse;
    __syncthreads();
  }
  // Penalized ids are distinct: no two threads touch one value.
  for (int i = e.penalized + static_cast<int>(threadIdx.x); i < e.banned; i += blockDim.x) {
    float& v = row[ids[i]];
    v = v < 0.0f ? v * e.penalty : v / e.penalty;
  }
  __syncthreads();
  set_ids(row, ids, e.banned, e.forced, -INFINITY);
  __syncthreads();
  if (e.forced < e.suppressed) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c] = -INFINITY;
    __syncthreads();
    set_ids(row, ids, e.forced, e.suppressed, 0.0f);
    __syncthreads();
  }
  set_ids(row, ids, e.suppressed, e.end, -INFINITY);
}

}  // namespace

void launch_edit_logits(float* x, int64_t cols, const LogitEdit* edits, int count,
                        const long long* ids, KernelStream stream) {
  if (count == 0) return;
  launch(edit_logits_kernel, static_cast<unsigned>(count), kEditThreads, 0, stream, x, cols, edits,
         ids);
}

}  // namespace kiln::cuda
