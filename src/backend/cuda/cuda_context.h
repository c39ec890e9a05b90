// The CUDA backend's context: the device, the stream every kernel and copy runs on, the
// cuBLASLt handle with its workspace, the status word kernels report bad data in, and the
// device copy of the step being executed. One per backend; used by the engine thread only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "backend/backend.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/weight_upload.h"

namespace kiln::cuda {

// Throws a kiln::Error naming the call and the CUDA / cuBLAS error.
void check_cuda(cudaError_t err, const char* call, const char* file, int line);
const char* cublas_status_name(cublasStatus_t status);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
#define KILN_CUDA_CHECK(call) ::kiln::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define KILN_CUBLAS_CHECK(call) ::kiln::cuda::check_cublas((call), #call, __FILE__, __LINE__)

// The kernel-side element type of a float dtype; throws for others.
FloatType float_type(DType dtype);
IndexType index_type(DType dtype);
// The kernel-side function of a kiln::Activation.
ActFn act_fn(Activation a);

// Device memory; allocations are zero-filled and given back when the last tensor lets go. Blocks
// up to kMaxCachedBlock bytes go to a cache instead of cudaFree (which waits for the whole device)
// and serve later requests of up to their size, so that per-request buffers (a T5 request's
// cross K/V, 2 x layers copies) cost no cudaMalloc once the cache is warm; 256 MB covers the KV
// cache's chunks of 64 blocks (96 MB for flan-t5-large and bloom-560m in 16-row blocks), so a new
// scheduler's cache costs no cudaMalloc either (~0.4 ms each on the H200). The cache holds at
// most kMaxCachedBytes and is emptied when the GPU runs out of memory. Work on the one stream
// is ordered, so a block freed while kernels still read it is only reused by later work.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(cudaStream_t stream);
  Device device() const override { return Device::kCuda; }
  std::shared_ptr<void> allocate(size_t bytes) override;
  // The same without waiting: zero-filled in the stream's order, so only for memory that work
  // on the stream alone touches (the KV cache's chunks and block table).
  std::shared_ptr<void> allocate_in_order(size_t bytes);
  // Host or device tensors (contiguous) to a new device tensor. A device source is copied on
  // the stream without waiting for it.
  Tensor upload(const Tensor& source) override;
  Tensor to_host(const Tensor& t) override;
  void copy_to_host(const Tensor& t, void* dst) override;
  // Device parts: one launch of copy_parts (kernels_elementwise.cu) for all of them, in stream
  // order, without waiting for it; host parts are uploaded.
  std::vector<std::vector<Tensor>> copy_groups(
      std::span<const std::vector<Tensor>> groups) override;
  // The same from device sources, without a slice per part: one buffer per group, its tensors
  // views of it (Tensor::view_at), one launch of copy_parts.
  std::vector<std::vector<Tensor>> copy_row_groups(std::span<const Tensor> sources,
                                                   std::span<const int64_t> row_bounds) override;
  // Bytes held in the cache, free for reuse.
  size_t cached_bytes() const;
  // Uninitialized device memory of at least `bytes`, from the cache or cudaMalloc.
  std::shared_ptr<void> allocate_raw(size_t bytes);
  // Called after each copy to the host has been waited for (CudaContext: a pending step check).
  void set_after_read(std::function<void()> after_read) { after_read_ = std::move(after_read); }

  static constexpr size_t kMaxCachedBlock = 256u << 20;
  static constexpr size_t kMaxCachedBytes = 2ull << 30;

 private:
  struct Cache;
  // One launch of copy_parts for `parts` (device sources and destinations), in stream order.
  void copy_parts(std::span<const CopyPart> parts);
  cudaStream_t stream_;
  std::shared_ptr<Cache> cache_;
  std::function<void()> after_read_;
};

class CudaContext {
 public:
  explicit CudaContext(Context& host);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  Context& host() { return host_; }
  cudaStream_t stream() const { return stream_; }
  // The stream with this context's launch policy, for kiln's kernel launchers (kernels.cuh).
  KernelStream kernel_stream() {
    return KernelStream(stream_, programmatic_, &after_library_, &launches_);
  }
  // Whether a kernel launched now may read the step's layout (uploaded by launch_uploads' kernel)
  // before its programmatic-launch wait: some launch came between. Every kiln kernel triggers
  // its dependents only after its own wait, so a kernel that starts early behind another one
  // starts after the uploads kernel has finished (and, with it, every step before); one
  // launched right behind the uploads kernel may start while it still writes. (A cuBLASLt
  // launch counts: the kiln kernel after it starts only when it has finished.)
  bool layout_visible() const { return launches_ > launches_at_uploads_; }
  // The launch count and the state after the last library launch, saved before a graph capture
  // and restored when the capture fails (its launches never ran: CudaExecutor::run_graph).
  struct LaunchCount {
    int64_t launches = 0;
    bool after_library = false;
  };
  LaunchCount launch_count() const { return {launches_, after_library_}; }
  void restore_launch_count(LaunchCount c) {
    launches_ = c.launches;
    after_library_ = c.after_library;
  }
  // The warps per SM the GEMV's split aims at for `rows` rows: 16 at one row, 8 at more
  // (kGemvWarpsOneRow, kGemvWarpsMoreRows); KILN_CUDA_GEMV_WARPS=N sets N at every row count (for
  // A/B runs).
  int gemv_warps_per_sm(int64_t rows) const {
    return gemv_warps_forced_ > 0 ? gemv_warps_forced_
           : rows <= 1            ? kGemvWarpsOneRow
                                  : kGemvWarpsMoreRows;
  }
  // The same for a one-row GEMV with a folded norm (64 registers a thread: four blocks fill an
  // SM's registers, so fewer of its blocks fit beside the kernel before it):
  // KILN_CUDA_GEMV_NORM_WARPS=N (for A/B runs), else gemv_warps_per_sm(1).
  int gemv_norm_warps_per_sm() const {
    return gemv_norm_warps_ > 0 ? gemv_norm_warps_ : gemv_warps_per_sm(1);
  }
  // The warps of a block of the warp attention kernel at a block per SM or fewer:
  // KILN_CUDA_ATTN_WARPS=16|8|4 forces them (for A/B runs); 0 (default): by the key count.
  int attention_warps() const { return attention_warps_; }
  // KILN_CUDA_TACTICS_INEXACT=1: a Linear runs the tactic of the smallest tuned row count >= its
  // rows at every count (LinearKernel::tactic_for; for A/B runs).
  bool inexact_tactics() const { return inexact_tactics_; }
  // A cuBLASLt kernel was just enqueued: the next kiln kernel is launched plainly.
  void note_library_launch() {
    after_library_ = true;
    ++launches_;
  }
  cublasLtHandle_t blas() const { return blas_; }
  void* blas_workspace() const { return blas_workspace_; }
  size_t blas_workspace_bytes() const { return kBlasWorkspaceBytes; }
  CudaAllocator& allocator() { return allocator_; }
  const std::string& device_name() const { return device_name_; }
  int sm() const { return sm_; }
  int device_index() const { return device_; }
  int multiprocessors() const { return sms_; }
  // KILN_CUDA_PROFILE set (read once): executors time every node with CUDA events and log the
  // totals per kernel when they are destroyed (steps run eagerly). KILN_CUDA_PROFILE=steps:
  // only whole steps are timed, graphs stay on; the log gives each step size's GPU time (CUDA
  // events around the step's launches) beside its wall time in execute().
  bool profile() const { return profile_; }
  bool profile_steps() const { return profile_steps_; }
  // KILN_CUDA_GEMV=0: few-row Linears run on cuBLASLt too instead of kiln's GEMV (for A/B runs;
  // the skinny GEMM's rows are KILN_CUDA_SKINNY_ROWS's).
  bool use_gemv() const { return use_gemv_; }
  // KILN_CUDA_GRAPHS=0: decode steps are launched kernel by kernel instead of replayed from a
  // captured CUDA graph (for A/B runs and debugging).
  bool use_graphs() const { return use_graphs_; }
  // Which steps' attention runs on the tensor-core kernel (attention_tiled.cu): prompts large
  // enough to fill the GPU (default); KILN_CUDA_TILED=0: none (the row kernel, for A/B runs);
  // KILN_CUDA_TILED=always: every step it can run (tests of the kernel on small cases).
  TiledAttention tiled_attention() const { return tiled_attention_; }
  // KILN_CUDA_WARP_ATTN=0: steps that do not take the tiled kernel run attention.cu's row
  // kernel (a block of threads per row and head) instead of the warp kernel
  // (attention_warps.cu) wherever that fits (for A/B runs, and tests of the row kernel).
  bool use_warp_attention() const { return use_warp_attention_; }
  // The most rows a Linear without a tactic runs on the GEMV (kGemvDefaultRows;
  // KILN_CUDA_GEMV_ROWS=1..8 for A/B runs and for tests of the GEMV at every row count).
  int gemv_rows() const { return gemv_rows_; }
  // The most rows a Linear without a tactic runs on the tensor-core skinny GEMM (rows past
  // gemv_rows(); kSkinnyDefaultRows; KILN_CUDA_SKINNY_ROWS=0..kSkinnyMaxRows for A/B runs). 0:
  // never, whatever the plan's tactics chose (cuBLASLt as before), and tactic timing skips it.
  int skinny_rows() const { return skinny_rows_; }
  // KILN_CUDA_GEMV_NORM=0: a Linear's fused input norm runs as the norm kernel into scratch
  // memory before the GEMV too, instead of inside it (the unfused kernels, for A/B runs).
  bool use_gemv_norm() const { return use_gemv_norm_; }
  // Which one-row GEMVs take the wide instance (GemvParams::wide): 1 (the default) those of a
  // Linear run right after another Linear whose wide grid still has a block for half the SMs or
  // more (cuda_linear.cc), 0 none (KILN_CUDA_GEMV_WIDE=0), 2 all (=2; for A/B runs and tests).
  int gemv_wide() const { return gemv_wide_; }
  // Query rows per block of that kernel (KILN_CUDA_TILED_ROWS=32|64, for A/B runs).
  int tiled_rows() const { return tiled_rows_; }
  // Read at construction, used inside: KILN_CUDA_SPLIT=0: decode attention never splits along
  // the keys (for A/B runs). KILN_CUDA_PDL=0: kernels wait for the one before them to finish
  // before they start, instead of programmatic dependent launch (sm_90+: the next kernel starts
  // early and streams its weights while the one before it finishes; for A/B runs).
  // KILN_CUDA_DEFER_CHECK=0: every step waits for the GPU in execute() (finish_step, for A/B
  // runs).

  DeviceStatus* status() { return status_; }
  // Ends a step of `graph`: the status word kernels report bad data in is copied to pinned host
  // memory behind the step's kernels (by a kernel). With `wait` (or KILN_CUDA_DEFER_CHECK=0) it
  // waits for the stream and checks it now; otherwise the check is pending and returns at once, so
  // that the host queues what reads the step's results (the argmax, its copy back) while the GPU
  // still runs the step: one wait a decode step instead of two. A pending check is made by the next
  // synchronize() — every read of device results on the host goes through it or through
  // finish_argmax_rows — or before the next step begins (settle()). Up to kMaxPending checks
  // wait at once (a step queued behind an unread one: StepContext::behind_unread); a third
  // step waits for the oldest.
  void finish_step(const Graph& graph, bool wait);
  // Waits for the stream; then each pending check, oldest first, throws if a kernel reported
  // bad data (naming the node of that step's graph) and clears the status and the later checks
  // (steps after a failed one are not trusted).
  void synchronize();
  // Makes the pending checks (waiting for the stream) before the next step reuses the step
  // buffers; a step queued behind an unread one skips this.
  void settle() {
    if (pending_ > 0) synchronize();
  }
  // The executor of `graph` goes away: a pending check of it is made without throwing (a
  // reported error is logged and cleared, not left to be blamed on another graph).
  void forget_step(const Graph& graph);
  // A step failed on the host after some of its kernels were queued: waits for them and clears
  // whatever they reported (the step's error is the one being thrown).
  void abandon_step();

  // Packs the step's layout into pinned memory, adds its upload to `list` and makes it the
  // current one kernels read; launch_uploads (which must follow, before the step's kernels)
  // enqueues it.
  void upload_step(const StepLayout& layout, UploadList& list);
  // Enqueues the uploads of `list` (one kernel, or copies past UploadList::kMaxBytes) and
  // empties it; the layout's pinned half is reusable once they have run.
  void launch_uploads(UploadList& list);
  // The device buffer the current step's layout is in (its address changes only when a step
  // needs more room than any before).
  const void* step_buffer() const { return step_device_; }
  const DeviceStep& step() const { return step_; }
  // attention_key_class of the current step's longest key count (split-sequence decode), and
  // the device memory of the splits' partial results (kSplitBlocks slots).
  int step_key_class() const { return step_key_class_; }
  // attention_key_bucket of the current step's longest key count (the warp kernel's block
  // size follows it at batch 1).
  int step_key_bucket() const { return step_key_bucket_; }
  // The current step's longest sequence, in rows (this step's tokens only).
  int64_t step_longest_rows() const { return step_longest_rows_; }
  float* split_scratch() const { return static_cast<float*>(split_scratch_.get()); }

  // Row argmax of device logits into `out` (one small copy back), skipping `banned` ids in the
  // rows flagged by `banned_rows` (empty: none); at most BannedIds::kMax ids.
  void argmax_rows(const Tensor& logits, std::span<int64_t> out,
                   std::span<const int64_t> banned = {}, std::span<const uint8_t> banned_rows = {});
  // The same in two halves (Backend::start_argmax_rows): the start queues the argmax, whose
  // kernel writes the ids to pinned memory too, and returns the device ids ([rows] int64, until
  // the next start); the finish waits for that kernel only (not for steps queued after it),
  // makes the pending checks it passed, and copies the ids to `out`.
  Tensor start_argmax_rows(const Tensor& logits, std::span<const int64_t> banned,
                           std::span<const uint8_t> banned_rows);
  void finish_argmax_rows(std::span<int64_t> out);
  // Backend::top_k_rows on the device (select.cu): k <= kMaxTopK, at most BannedIds::kMax ids.
  static constexpr int kMaxTopK = 256;
  void top_k_rows(const Tensor& logits, int k, std::span<const float> temperature,
                  std::span<const int64_t> banned, std::span<const uint8_t> banned_rows,
                  TopKRows* out);

  // Backend::gather_ids on the device: one uploads kernel (or a few) copies runs of kept rows
  // and the tail (staged in pinned memory, two halves used in turn) into a new buffer.
  Tensor gather_ids(const Tensor& ids, std::span<const int64_t> keep,
                    std::span<const int64_t> tail);

  // Backend::edit_logits_rows on the device (logit_edits.cu): one upload of the edits, one
  // kernel, queued before what reads the logits.
  void edit_logits_rows(Tensor& logits, std::span<const RowEdit> edits);

  // The device copy of a weight, uploaded once per backend (graphs that share a weight share
  // the copy).
  Tensor device_weight(const Tensor& host);
  // Uploads the host weights that have no device copy yet in one bulk copy (weight_upload.h:
  // one allocation, parallel staged chunks, no per-tensor wait); device_weight finds them.
  // KILN_CUDA_UPLOAD_THREADS=N sets the workers (0: none, each weight is uploaded alone when
  // first used, the way before the bulk copy), KILN_CUDA_UPLOAD_CHUNK_MB=N their chunks.
  UploadStats upload_weights(std::span<const Tensor> hosts);
  // A device vector of n copies of `value` in `dtype`, made once per (dtype, n, value) and
  // shared (the norm kernel's unit weight and zero bias for folded norms).
  Tensor filled_vector(DType dtype, int64_t n, float value);

 private:
  static constexpr size_t kBlasWorkspaceBytes = 32u << 20;
  // Warps per SM of a GEMV (gemv_split). One row: 16 measured 4.6 % faster than 32 on
  // flan-t5-large's batch-1 decode step on the H200 (its gate/up GEMV takes 2 warps a feature
  // group instead of 4; bloom-560m's splits are the same at both), and the same as 8 and 12
  // within 1 %. Two rows and more (each row's sums in registers: 106+ a thread, two blocks an
  // SM): 8 leaves room on every SM for the next kernel's blocks to start and load their weights
  // early; batch-2 decode steps 0.83 -> 0.72 ms (bloom-560m), 0.95 -> 0.84 (flan-t5-large)
  // against 16 (bench/gpu/h200-2026-12-01w-gemv-warps-ab.log).
  static constexpr int kGemvWarpsOneRow = 16;
  static constexpr int kGemvWarpsMoreRows = 8;
  Context& host_;
  int device_ = 0;
  int sm_ = 0;
  int sms_ = 0;
  bool use_gemv_ = true;
  bool use_graphs_ = true;
  bool use_splits_ = true;
  bool use_warp_attention_ = true;
  bool use_gemv_norm_ = true;
  int gemv_wide_ = 1;
  TiledAttention tiled_attention_ = TiledAttention::kAuto;
  int tiled_rows_ = 64;
  bool profile_ = false;
  bool profile_steps_ = false;
  bool programmatic_ = false;        // programmatic dependent launch (sm_90+, not KILN_CUDA_PDL=0)
  bool defer_checks_ = true;         // not KILN_CUDA_DEFER_CHECK=0
  bool after_library_ = false;       // note_library_launch(), until the next kiln launch
  int64_t launches_ = 0;             // kernels launched on the stream (kiln's and cuBLASLt's)
  int64_t launches_at_uploads_ = 0;  // launches_ after the last launch_uploads
  int gemv_warps_forced_ = 0;        // KILN_CUDA_GEMV_WARPS; 0: by the row count
  int gemv_norm_warps_ = 0;          // KILN_CUDA_GEMV_NORM_WARPS; 0: as gemv_warps_per_sm(1)
  int gemv_rows_ = kGemvDefaultRows;
  int skinny_rows_ = kSkinnyDefaultRows;
  int attention_warps_ = 0;
  bool inexact_tactics_ = false;
  int upload_threads_ = 1;    // KILN_CUDA_UPLOAD_THREADS, else half the cores (1 to 8)
  int upload_chunk_mib_ = 4;  // KILN_CUDA_UPLOAD_CHUNK_MB
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t blas_ = nullptr;
  void* blas_workspace_ = nullptr;
  DeviceStatus* status_ = nullptr;
  // A step's status copied behind it and not checked yet: the graph it ran, the pinned copy,
  // and an event after the copy. A ring of kMaxPending, oldest at first_check_.
  struct PendingCheck {
    uint64_t number = 0;
    const Graph* graph = nullptr;
    DeviceStatus* host = nullptr;
    cudaEvent_t copied = nullptr;
  };
  static constexpr int kMaxPending = 2;
  PendingCheck checks_[kMaxPending];
  DeviceStatus* status_host_ = nullptr;  // pinned: kMaxPending copies
  int first_check_ = 0;
  int pending_ = 0;
  // Checks are numbered in the order steps end; the last start_argmax_rows came after check
  // argmax_after_ (its finish makes that one and those before it, not later steps').
  uint64_t checks_made_ = 0;
  uint64_t argmax_after_ = 0;
  // Waits for the oldest pending copy and checks it.
  void check_oldest();
  CudaAllocator allocator_{nullptr};
  // The step's layout: packed on the host (pinned, two halves used in turn so that a step can
  // be packed while the copy of the one before is queued; step_copied_ follows each half's
  // copy), copied to device memory that grows only when a step needs more than any before.
  void* step_host_ = nullptr;
  cudaEvent_t step_copied_[2] = {nullptr, nullptr};
  int step_half_ = 0;
  bool step_copy_due_ = false;  // upload_step added a part launch_uploads has not enqueued
  void* step_device_ = nullptr;
  size_t step_capacity_ = 0;
  int block_stride_ = 0;
  DeviceStep step_{};
  int step_key_class_ = 0;
  int step_key_bucket_ = 0;
  int64_t step_longest_rows_ = 0;
  std::shared_ptr<void> split_scratch_;
  // Keyed by the host bytes; the host tensor is kept so that its address is not reused.
  std::map<const void*, std::pair<Tensor, Tensor>> weights_;
  std::map<std::tuple<DType, int64_t, float>, Tensor> filled_;
  // ids, then a flag byte per row, then the rows' counters of finished blocks (zero between
  // launches), then scratch (the chunks' keys)
  std::shared_ptr<void> argmax_device_;
  unsigned char* argmax_host_ = nullptr;               // pinned: the ids and flags
  long long* gather_host_ = nullptr;                   // pinned: gather_ids' tails, two halves
  size_t gather_half_ids_ = 0;                         // ids a half holds
  int gather_half_ = 0;                                // the half the next tail goes to
  cudaEvent_t gather_copied_[2] = {nullptr, nullptr};  // a half's upload has run
  size_t argmax_capacity_ = 0;
  size_t argmax_scratch_capacity_ = 0;  // bytes of the chunks' keys
  // Where the counters and the keys begin in argmax_device_, each 256-byte aligned.
  static size_t align256(size_t n) { return (n + 255) / 256 * 256; }
  size_t argmax_done_offset() const { return align256(argmax_capacity_ * (sizeof(long long) + 1)); }
  size_t argmax_keys_offset() const {
    return align256(argmax_done_offset() + argmax_capacity_ * sizeof(unsigned int));
  }
  size_t argmax_started_ = 0;  // rows of the last start_argmax_rows
  cudaEvent_t argmax_copied_ = nullptr;
  // Device memory of top_k_rows: its inputs, scratch and results, grown when a call needs more.
  std::shared_ptr<void> topk_device_;
  size_t topk_capacity_ = 0;
  // Host staging of its results.
  std::vector<unsigned char> topk_host_;
  // edit_logits_rows's LogitEdit headers then ids, on the device and staged on the host.
  std::shared_ptr<void> edits_device_;
  size_t edits_capacity_ = 0;
  std::vector<unsigned char> edits_host_;
};

}  // namespace kiln::cuda
