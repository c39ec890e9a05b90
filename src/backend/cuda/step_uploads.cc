#include "backend/cuda/step_uploads.h"

#include <algorithm>

#include "backend/cuda/cuda_common.h"

namespace kiln::cuda {

StepUploads::StepUploads(LaunchStream& stream, CudaAllocator& allocator, bool splits)
    : stream_(stream), splits_(splits) {
  for (cudaEvent_t& e : copied_)
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  split_scratch_ =
      allocator.allocate(static_cast<size_t>(kSplitBlocks) * (kMaxHeadDim + 2) * sizeof(float));
}

StepUploads::~StepUploads() {
  cudaStreamSynchronize(stream_.stream());
  split_scratch_.reset();
  cudaFree(device_);
  cudaFreeHost(host_);
  for (cudaEvent_t e : copied_)
    if (e != nullptr) cudaEventDestroy(e);
}

void StepUploads::launch_uploads(UploadList& list) {
  long long total = 0;
  for (int i = 0; i < list.count; ++i) total += list.part[i].bytes;
  if (total <= UploadList::kMaxBytes) {
    ::kiln::cuda::launch_uploads(list, stream_.kernel_stream());
    KILN_CUDA_CHECK(cudaGetLastError());
  } else {
    for (int i = 0; i < list.count; ++i)
      if (list.part[i].bytes > 0)
        KILN_CUDA_CHECK(cudaMemcpyAsync(list.part[i].dst, list.part[i].src,
                                        static_cast<size_t>(list.part[i].bytes), cudaMemcpyDefault,
                                        stream_.stream()));
  }
  list.count = 0;
  stream_.note_uploads();  // copies too: a kernel right behind them is plain
  if (copy_due_) KILN_CUDA_CHECK(cudaEventRecord(copied_[half_], stream_.stream()));
  copy_due_ = false;
}

void StepUploads::upload_step(const StepLayout& layout, UploadList& list) {
  KILN_CHECK(list.count < UploadList::kMax, "upload_step: the upload list is full");
  const int seqs = layout.num_seqs();
  const int64_t tokens = layout.total_tokens();
  int cross_layers = 0;
  for (const CrossKv* c : layout.cross)
    if (c != nullptr) cross_layers = std::max(cross_layers, static_cast<int>(c->keys.size()));
  // The block table's row stride only grows (in powers of two), so that a decode step's device
  // layout keeps the same addresses and widths from one step to the next while its sequences
  // grow: a CUDA graph captured for it stays valid.
  while (block_stride_ < layout.max_blocks) block_stride_ = std::max(2 * block_stride_, 16);
  const int stride = block_stride_;
  // Layout of the buffer: pointers first (8-byte aligned), then the int arrays.
  const size_t pointers = static_cast<size_t>(seqs) * cross_layers * 2;
  const size_t ints = static_cast<size_t>(seqs + 1) + seqs + static_cast<size_t>(tokens) +
                      static_cast<size_t>(seqs) * stride + seqs;
  const size_t bytes = pointers * sizeof(void*) + ints * sizeof(int);
  if (bytes > capacity_) {
    const size_t grown = std::max<size_t>(bytes * 2, 4096);
    if (device_ != nullptr) {
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream_.stream()));
      cudaFree(device_);
      cudaFreeHost(host_);
      device_ = host_ = nullptr;
    }
    KILN_CUDA_CHECK(cudaMalloc(&device_, grown));
    KILN_CUDA_CHECK(cudaMallocHost(&host_, 2 * grown));
    capacity_ = grown;
  }
  // This half's last copy (two steps ago) may still be reading it.
  half_ ^= 1;
  KILN_CUDA_CHECK(cudaEventSynchronize(copied_[half_]));
  void* packed = static_cast<char*>(host_) + half_ * capacity_;
  auto** ptr = static_cast<const void**>(packed);
  for (int s = 0; s < seqs; ++s)
    for (int l = 0; l < cross_layers; ++l) {
      const CrossKv* c = layout.cross[s];
      const bool has = c != nullptr && l < static_cast<int>(c->keys.size());
      ptr[static_cast<size_t>(s) * cross_layers + l] = has ? c->keys[l].raw() : nullptr;
      ptr[pointers / 2 + static_cast<size_t>(s) * cross_layers + l] =
          has ? c->values[l].raw() : nullptr;
    }
  int* ints_host = reinterpret_cast<int*>(ptr + pointers);
  int* at = ints_host;
  const size_t begin_off = 0;
  at = std::copy(layout.token_begin.begin(), layout.token_begin.end(), at);
  const size_t past_off = static_cast<size_t>(at - ints_host);
  at = std::copy(layout.past_len.begin(), layout.past_len.end(), at);
  const size_t seq_off = static_cast<size_t>(at - ints_host);
  for (int s = 0; s < seqs; ++s)
    for (int64_t r = layout.token_begin[s]; r < layout.token_begin[s + 1]; ++r) *at++ = s;
  const size_t table_off = static_cast<size_t>(at - ints_host);
  for (int s = 0; s < seqs; ++s) {
    const std::span<const int32_t> row = layout.blocks(s);
    at = std::copy(row.begin(), row.end(), at);
    at = std::fill_n(at, stride - static_cast<int>(row.size()), -1);
  }
  const size_t cross_off = static_cast<size_t>(at - ints_host);
  for (int s = 0; s < seqs; ++s)
    *at++ = layout.cross[s] != nullptr ? static_cast<int>(layout.cross[s]->length()) : 0;
  list.part[list.count++] = {packed, device_, static_cast<long long>(bytes), true};
  copy_due_ = true;
  const void* const* dptr = static_cast<const void* const*>(device_);
  const int* dints = reinterpret_cast<const int*>(dptr + pointers);
  step_.num_seqs = seqs;
  step_.max_blocks = stride;
  step_.token_begin = dints + begin_off;
  step_.past_len = dints + past_off;
  step_.token_seq = dints + seq_off;
  step_.block_table = dints + table_off;
  step_.cross_len = dints + cross_off;
  step_.cross_layers = cross_layers;
  step_.cross_k = dptr;
  step_.cross_v = dptr + pointers / 2;
  int64_t longest = 0;
  longest_rows_ = 0;
  for (int s = 0; s < seqs; ++s) {
    longest_rows_ = std::max(longest_rows_, layout.num_tokens(s));
    longest = std::max(longest, layout.past_len[s] + layout.num_tokens(s));
    if (layout.cross[s] != nullptr) longest = std::max(longest, layout.cross[s]->length());
  }
  key_class_ = splits_ ? attention_key_class(longest) : 0;
  key_bucket_ = attention_key_bucket(longest);
}

}  // namespace kiln::cuda
