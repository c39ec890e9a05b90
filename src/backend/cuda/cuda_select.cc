#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_select.h"

namespace kiln::cuda {

// The kernels' fixed-size copy of the ids to ban (at most BannedIds::kMax, checked by callers).
static BannedIds banned_ids(std::span<const int64_t> banned) {
  BannedIds ids{};
  ids.count = static_cast<int>(banned.size());
  for (size_t i = 0; i < banned.size(); ++i) ids.id[i] = banned[i];
  return ids;
}

CudaTokenSelector::CudaTokenSelector(CudaContext& ctx) : ctx_(ctx) {
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&argmax_copied_, cudaEventDisableTiming));
  for (cudaEvent_t& e : gather_copied_)
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CudaTokenSelector::~CudaTokenSelector() {
  // Device buffers go back to the allocator while its stream exists, and nothing queued may
  // still write the pinned ones.
  cudaStreamSynchronize(ctx_.stream());
  argmax_device_.reset();
  topk_device_.reset();
  edits_device_.reset();
  cudaFreeHost(argmax_host_);
  cudaFreeHost(gather_host_);
  for (cudaEvent_t e : gather_copied_)
    if (e != nullptr) cudaEventDestroy(e);
  if (argmax_copied_ != nullptr) cudaEventDestroy(argmax_copied_);
}

bool CudaTokenSelector::argmax_rows(const Tensor& logits, std::span<int64_t> out,
                                    std::span<const int64_t> banned,
                                    std::span<const uint8_t> banned_rows) {
  if (!on_device(logits) || banned.size() > BannedIds::kMax) return false;
  start_argmax(logits, banned, banned_rows);
  finish_argmax(out);
  return true;
}

bool CudaTokenSelector::start_argmax_rows(const Tensor& logits, std::span<const int64_t> banned,
                                          std::span<const uint8_t> banned_rows, Tensor* ids) {
  if (!on_device(logits) || banned.size() > BannedIds::kMax) return false;
  *ids = start_argmax(logits, banned, banned_rows);
  return true;
}

void CudaTokenSelector::finish_argmax_rows(std::span<int64_t> out) { finish_argmax(out); }

Tensor CudaTokenSelector::start_argmax(const Tensor& logits, std::span<const int64_t> banned,
                                       std::span<const uint8_t> banned_rows) {
  KILN_CHECK(on_device(logits) && logits.rank() == 2, "argmax_rows: {} logits {}",
             kiln::device_name(logits.device()), shape_str(logits.shape()));
  const size_t rows = static_cast<size_t>(logits.dim(0));
  KILN_CHECK(banned.size() <= static_cast<size_t>(BannedIds::kMax) &&
                 (banned_rows.empty() || banned_rows.size() == rows),
             "argmax_rows: {} banned ids (at most {}), {} row flags for {} rows", banned.size(),
             BannedIds::kMax, banned_rows.size(), rows);
  const size_t scratch = argmax_scratch_bytes(logits.dim(0), logits.dim(1));
  if (rows > argmax_capacity_ || scratch > argmax_scratch_capacity_) {
    // The last start's kernels may still write its buffers.
    KILN_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
    argmax_capacity_ = std::max<size_t>({rows, argmax_capacity_, 256});
    argmax_scratch_capacity_ = std::max(scratch, argmax_scratch_capacity_);
    // The ids, then one flag byte per row (device and pinned host alike), then the rows'
    // counters of finished blocks (zeroed once here; each launch leaves them zero) and the
    // chunks' keys (device only, each from a 256-byte boundary).
    const size_t bytes = argmax_capacity_ * (sizeof(long long) + 1);
    argmax_device_ = ctx_.allocator().allocate(argmax_keys_offset() + argmax_scratch_capacity_);
    KILN_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(argmax_device_.get()) + argmax_done_offset(),
                                    0, argmax_capacity_ * sizeof(unsigned int), ctx_.stream()));
    cudaFreeHost(argmax_host_);
    argmax_host_ = nullptr;
    void* host = nullptr;
    KILN_CUDA_CHECK(cudaMallocHost(&host, bytes));
    argmax_host_ = static_cast<unsigned char*>(host);
  }
  argmax_started_ = rows;
  argmax_after_ = ctx_.checks().made();
  auto* ids = static_cast<long long*>(argmax_device_.get());
  if (rows == 0)
    return Tensor::view(DType::kI64, {0}, ids, argmax_device_, ctx_.allocator().device());
  unsigned char* flags = nullptr;
  BannedIds ban{};
  RowMask mask{};
  if (!banned.empty() && !banned_rows.empty()) {
    ban = banned_ids(banned);
    if (rows <= static_cast<size_t>(RowMask::kRows)) {
      // By value, in the kernel's parameters: no copy to wait for before it.
      for (size_t r = 0; r < rows; ++r)
        if (banned_rows[r] != 0) mask.bits[r / 64] |= 1ull << (r % 64);
    } else {
      // Through pinned memory: a copy from pageable memory may wait for the stream. The
      // previous start's copy of the flags ran before its ids were read, which was before this
      // start.
      flags = reinterpret_cast<unsigned char*>(ids + argmax_capacity_);
      unsigned char* staged = argmax_host_ + argmax_capacity_ * sizeof(long long);
      std::memcpy(staged, banned_rows.data(), rows);
      KILN_CUDA_CHECK(cudaMemcpyAsync(flags, staged, rows, cudaMemcpyHostToDevice, ctx_.stream()));
    }
  }
  // The decode kernel writes the ids to the pinned host buffer too (mapped: pinned memory is
  // addressable from the GPU under unified addressing), so no copy follows it: copies in the
  // stream cost several microseconds each between two decode steps.
  static_assert(sizeof(long long) == sizeof(int64_t));
  launch_argmax_rows(float_type(logits.dtype()), logits.raw(), logits.dim(0), logits.dim(1), ban,
                     flags, mask, static_cast<char*>(argmax_device_.get()) + argmax_keys_offset(),
                     reinterpret_cast<unsigned int*>(static_cast<char*>(argmax_device_.get()) +
                                                     argmax_done_offset()),
                     ids, reinterpret_cast<long long*>(argmax_host_), ctx_.kernel_stream());
  KILN_CUDA_CHECK(cudaEventRecord(argmax_copied_, ctx_.stream()));
  return Tensor::view(DType::kI64, {static_cast<int64_t>(rows)}, ids, argmax_device_,
                      ctx_.allocator().device());
}

void CudaTokenSelector::finish_argmax(std::span<int64_t> out) {
  KILN_CHECK(out.size() == argmax_started_, "finish_argmax_rows: {} outputs for {} rows",
             out.size(), argmax_started_);
  if (out.empty()) return;
  KILN_CUDA_CHECK(cudaEventSynchronize(argmax_copied_));
  KILN_CUDA_CHECK(cudaGetLastError());
  // The checks of the steps queued before the argmax are due (their copies came before its
  // ids'); a step queued after it (run-ahead) stays pending, even if it has finished: its
  // errors are its own read's.
  ctx_.checks().check_through(argmax_after_);
  std::memcpy(out.data(), argmax_host_, out.size() * sizeof(int64_t));
}

bool CudaTokenSelector::top_k_rows(const Tensor& logits, int k, std::span<const float> temperature,
                                   std::span<const int64_t> banned,
                                   std::span<const uint8_t> banned_rows, TopKRows* out) {
  if (!on_device(logits) || k < 1 || k > kMaxTopK || banned.size() > BannedIds::kMax) return false;
  const size_t rows = logits.rank() == 2 ? static_cast<size_t>(logits.dim(0)) : 0;
  KILN_CHECK(logits.rank() == 2, "top_k_rows: {} logits {}, k {} (1..{})",
             kiln::device_name(logits.device()), shape_str(logits.shape()), k, kMaxTopK);
  KILN_CHECK((temperature.empty() || temperature.size() == rows) &&
                 banned.size() <= static_cast<size_t>(BannedIds::kMax) &&
                 (banned_rows.empty() || banned_rows.size() == rows),
             "top_k_rows: {} temperatures, {} banned ids (at most {}), {} row flags for {} rows",
             temperature.size(), banned.size(), BannedIds::kMax, banned_rows.size(), rows);
  out->k = k;
  out->ids.assign(rows * static_cast<size_t>(k), -1);
  out->values.assign(rows * static_cast<size_t>(k), -INFINITY);
  out->log_norm.assign(rows, 0.0f);
  if (rows == 0) return true;
  const bool ban = !banned.empty() && !banned_rows.empty();
  auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  // Inputs (temperatures, row flags), scratch, then the results in one piece to copy back.
  const size_t in_bytes = align(rows * sizeof(float) + rows);
  const size_t scratch_bytes = align(topk_scratch_bytes(logits.dim(0), logits.dim(1), k));
  const size_t result_bytes =
      rows * static_cast<size_t>(k) * (sizeof(float) + sizeof(int)) + rows * sizeof(float);
  if (in_bytes + scratch_bytes + result_bytes > topk_capacity_) {
    topk_capacity_ = in_bytes + scratch_bytes + result_bytes;
    topk_device_ = ctx_.allocator().allocate(topk_capacity_);
  }
  auto* base = static_cast<unsigned char*>(topk_device_.get());
  topk_host_.resize(std::max(in_bytes, result_bytes));
  if (!temperature.empty()) std::memcpy(topk_host_.data(), temperature.data(), rows * 4);
  if (ban) std::memcpy(topk_host_.data() + rows * sizeof(float), banned_rows.data(), rows);
  if (!temperature.empty() || ban)
    KILN_CUDA_CHECK(cudaMemcpyAsync(base, topk_host_.data(), rows * sizeof(float) + rows,
                                    cudaMemcpyHostToDevice, ctx_.stream()));
  const BannedIds ids = ban ? banned_ids(banned) : BannedIds{};
  unsigned char* result = base + in_bytes + scratch_bytes;
  auto* values = reinterpret_cast<float*>(result);
  auto* columns = reinterpret_cast<int*>(values + rows * k);
  auto* log_norm = reinterpret_cast<float*>(columns + rows * k);
  launch_topk_rows(float_type(logits.dtype()), logits.raw(), logits.dim(0), logits.dim(1), k,
                   temperature.empty() ? nullptr : reinterpret_cast<const float*>(base), ids,
                   ban ? base + rows * sizeof(float) : nullptr, base + in_bytes, values, columns,
                   log_norm, ctx_.kernel_stream());
  KILN_CUDA_CHECK(cudaGetLastError());
  KILN_CUDA_CHECK(cudaMemcpyAsync(topk_host_.data(), result, result_bytes, cudaMemcpyDeviceToHost,
                                  ctx_.stream()));
  ctx_.checks().synchronize();
  const size_t n = rows * static_cast<size_t>(k);
  std::memcpy(out->values.data(), topk_host_.data(), n * sizeof(float));
  const auto* host_columns = reinterpret_cast<const int*>(topk_host_.data() + n * sizeof(float));
  for (size_t i = 0; i < n; ++i) out->ids[i] = host_columns[i];
  std::memcpy(out->log_norm.data(), topk_host_.data() + n * (sizeof(float) + sizeof(int)),
              rows * sizeof(float));
  return true;
}

void CudaTokenSelector::edit_logits_rows(Tensor& logits, std::span<const RowEdit> edits) {
  if (!on_device(logits)) {
    TokenSelector::edit_logits_rows(logits, edits);
    return;
  }
  check_row_edits(logits, edits);
  if (edits.empty()) return;
  std::vector<LogitEdit> heads(edits.size());
  std::vector<long long> ids;
  for (size_t i = 0; i < edits.size(); ++i) {
    const RowEdit& e = edits[i];
    LogitEdit& h = heads[i];
    h.row = e.row;
    h.penalty = e.penalty;
    h.log_softmax = e.log_softmax ? 1 : 0;
    h.penalized = static_cast<int>(ids.size());
    ids.insert(ids.end(), e.penalized.begin(), e.penalized.end());
    h.banned = static_cast<int>(ids.size());
    ids.insert(ids.end(), e.banned.begin(), e.banned.end());
    h.forced = static_cast<int>(ids.size());
    ids.insert(ids.end(), e.forced.begin(), e.forced.end());
    h.suppressed = static_cast<int>(ids.size());
    ids.insert(ids.end(), e.suppressed.begin(), e.suppressed.end());
    h.end = static_cast<int>(ids.size());
  }
  const size_t head_bytes = align256(heads.size() * sizeof(LogitEdit));
  const size_t bytes = head_bytes + ids.size() * sizeof(long long);
  if (bytes > edits_capacity_) {
    // Kernels queued before may still read the old buffer: the allocator's buffers are freed
    // in stream order (as topk_device_'s are).
    edits_capacity_ = std::max<size_t>(bytes, 4096);
    edits_device_ = ctx_.allocator().allocate(edits_capacity_);
  }
  edits_host_.resize(bytes);
  std::memcpy(edits_host_.data(), heads.data(), heads.size() * sizeof(LogitEdit));
  if (!ids.empty())
    std::memcpy(edits_host_.data() + head_bytes, ids.data(), ids.size() * sizeof(long long));
  // From pageable memory: the call returns once the bytes are staged, so edits_host_ may be
  // reused by the next call.
  auto* base = static_cast<unsigned char*>(edits_device_.get());
  KILN_CUDA_CHECK(
      cudaMemcpyAsync(base, edits_host_.data(), bytes, cudaMemcpyHostToDevice, ctx_.stream()));
  launch_edit_logits(static_cast<float*>(logits.raw()), logits.dim(1),
                     reinterpret_cast<const LogitEdit*>(base), static_cast<int>(heads.size()),
                     reinterpret_cast<const long long*>(base + head_bytes), ctx_.kernel_stream());
  KILN_CUDA_CHECK(cudaGetLastError());
}

Tensor CudaTokenSelector::gather_ids(const Tensor& ids, std::span<const int64_t> keep,
                                     std::span<const int64_t> tail) {
  if (!on_device(ids)) return TokenSelector::gather_ids(ids, keep, tail);
  KILN_CHECK(ids.dtype() == DType::kI64 && ids.rank() == 1, "gather_ids: {} {} ids {}",
             kiln::device_name(ids.device()), dtype_name(ids.dtype()), shape_str(ids.shape()));
  const int64_t n = static_cast<int64_t>(keep.size() + tail.size());
  std::shared_ptr<void> out = ctx_.allocator().allocate_raw(
      static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(long long));
  auto* dst = static_cast<long long*>(out.get());
  const auto* src = static_cast<const long long*>(ids.raw());
  UploadList list;
  auto add = [&](const void* from, void* to, int64_t count, bool host) {
    if (list.count == UploadList::kMax) ctx_.uploads().launch_uploads(list);
    list.part[list.count++] = {from, to, count * static_cast<long long>(sizeof(long long)), host};
  };
  // Runs of consecutive kept rows, one part each.
  for (size_t i = 0; i < keep.size();) {
    size_t j = i + 1;
    while (j < keep.size() && keep[j] == keep[j - 1] + 1) ++j;
    KILN_CHECK(keep[i] >= 0 && keep[j - 1] < ids.dim(0), "gather_ids: rows {}..{} of {} ids",
               keep[i], keep[j - 1], ids.dim(0));
    add(src + keep[i], dst + i, static_cast<int64_t>(j - i), false);
    i = j;
  }
  int half = -1;
  if (!tail.empty()) {
    half = gather_half_;
    gather_half_ ^= 1;
    if (tail.size() > gather_half_ids_) {
      // Both halves' uploads may still be queued.
      KILN_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
      cudaFreeHost(gather_host_);
      gather_host_ = nullptr;
      gather_half_ids_ = std::max<size_t>(2 * tail.size(), 4096);
      void* host = nullptr;
      KILN_CUDA_CHECK(cudaMallocHost(&host, 2 * gather_half_ids_ * sizeof(long long)));
      gather_host_ = static_cast<long long*>(host);
    } else {
      KILN_CUDA_CHECK(cudaEventSynchronize(gather_copied_[half]));
    }
    long long* staged = gather_host_ + static_cast<size_t>(half) * gather_half_ids_;
    for (size_t i = 0; i < tail.size(); ++i) staged[i] = tail[i];
    add(staged, dst + keep.size(), static_cast<int64_t>(tail.size()), true);
  }
  ctx_.uploads().launch_uploads(list);
  if (half >= 0) KILN_CUDA_CHECK(cudaEventRecord(gather_copied_[half], ctx_.stream()));
  return Tensor::view(DType::kI64, {n}, dst, out, ctx_.allocator().device());
}

}  // namespace kiln::cuda
