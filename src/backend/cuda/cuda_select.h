// Token selection on the GPU (select.cu, logit_edits.cu) for the CUDA backend: the greedy argmax
// of decode steps, whose ids reach pinned host memory from the kernel itself, the k best tokens
// of each row for sampling and beam search, the logits processors' edits and run-ahead's
// gathered ids, with the device and pinned buffers they use. Host tensors go to the host
// selection (TokenSelector's own methods) or are refused as there.
#pragma once

#include <memory>
#include <vector>

#include "backend/cuda/cuda_context.h"
#include "backend/token_selector.h"

namespace kiln::cuda {

class CudaTokenSelector final : public TokenSelector {
 public:
  static constexpr int kMaxTopK = 256;
  explicit CudaTokenSelector(CudaContext& ctx);
  ~CudaTokenSelector() override;
  CudaTokenSelector(const CudaTokenSelector&) = delete;
  CudaTokenSelector& operator=(const CudaTokenSelector&) = delete;

  // Row argmax of device logits (one small copy back), at most BannedIds::kMax banned ids.
  bool argmax_rows(const Tensor& logits, std::span<int64_t> out, std::span<const int64_t> banned,
                   std::span<const uint8_t> banned_rows) override;
  // The start queues the argmax, whose kernel writes the ids to pinned memory too, and returns
  // the device ids ([rows] int64, until the next start); the finish waits for that kernel only
  // (not for steps queued after it), makes the pending checks it passed, and copies the ids.
  bool start_argmax_rows(const Tensor& logits, std::span<const int64_t> banned,
                         std::span<const uint8_t> banned_rows, Tensor* ids) override;
  void finish_argmax_rows(std::span<int64_t> out) override;
  // One uploads kernel (or a few) copies runs of kept rows and the tail (staged in pinned
  // memory, two halves used in turn) into a new buffer.
  Tensor gather_ids(const Tensor& ids, std::span<const int64_t> keep,
                    std::span<const int64_t> tail) override;
  int max_top_k() const override { return kMaxTopK; }
  bool top_k_rows(const Tensor& logits, int k, std::span<const float> temperature,
                  std::span<const int64_t> banned, std::span<const uint8_t> banned_rows,
                  TopKRows* out) override;
  // One upload of the edits, one kernel, queued before what reads the logits.
  void edit_logits_rows(Tensor& logits, std::span<const RowEdit> edits) override;

 private:
  Tensor start_argmax(const Tensor& logits, std::span<const int64_t> banned,
                      std::span<const uint8_t> banned_rows);
  void finish_argmax(std::span<int64_t> out);
  bool on_device(const Tensor& t) const { return t.device() == ctx_.allocator().device(); }

  CudaContext& ctx_;
  // ids, then a flag byte per row, then the rows' counters of finished blocks (zero between
  // launches), then scratch (the chunks' keys)
  std::shared_ptr<void> argmax_device_;
  unsigned char* argmax_host_ = nullptr;  // pinned: the ids and flags
  size_t argmax_capacity_ = 0;
  size_t argmax_scratch_capacity_ = 0;  // bytes of the chunks' keys
  // Where the counters and the keys begin in argmax_device_, each 256-byte aligned.
  static size_t align256(size_t n) { return (n + 255) / 256 * 256; }
  size_t argmax_done_offset() const { return align256(argmax_capacity_ * (sizeof(long long) + 1)); }
  size_t argmax_keys_offset() const {
    return align256(argmax_done_offset() + argmax_capacity_ * sizeof(unsigned int));
  }
  size_t argmax_started_ = 0;  // rows of the last start_argmax_rows
  uint64_t argmax_after_ = 0;  // the last step check made before it (StepChecks::made)
  cudaEvent_t argmax_copied_ = nullptr;
  long long* gather_host_ = nullptr;                   // pinned: gather_ids' tails, two halves
  size_t gather_half_ids_ = 0;                         // ids a half holds
  int gather_half_ = 0;                                // the half the next tail goes to
  cudaEvent_t gather_copied_[2] = {nullptr, nullptr};  // a half's upload has run
  // Device memory of top_k_rows: its inputs, scratch and results, grown when a call needs more.
  std::shared_ptr<void> topk_device_;
  size_t topk_capacity_ = 0;
  std::vector<unsigned char> topk_host_;  // host staging of its results
  // edit_logits_rows's LogitEdit headers then ids, on the device and staged on the host.
  std::shared_ptr<void> edits_device_;
  size_t edits_capacity_ = 0;
  std::vector<unsigned char> edits_host_;
};

}  // namespace kiln::cuda
