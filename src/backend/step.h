// What kernels need to know about one step's batch, as one flat layout a GPU backend can upload
// in a single copy: where each sequence's tokens are in the ragged activations, how long its
// cached past is, its row of the block table, and the copy-on-write block copies to make before
// any kernel runs. This is a layout, not a request: nothing here knows about prompts or
// sampling.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/kv_storage.h"

namespace kiln {

struct StepLayout {
  std::vector<int32_t> token_begin;  // [seqs + 1]: sequence s owns rows [begin[s], begin[s+1])
  std::vector<int32_t> past_len;     // [seqs]: positions already cached; new ones start here
  int32_t max_blocks = 0;            // width of the block table
  // [seqs, max_blocks], row-major, -1 past a sequence's last block. Covers past_len + tokens
  // positions, and no block written this step is shared with another sequence.
  std::vector<int32_t> block_table;
  std::vector<const CrossKv*> cross;  // [seqs]: the request's cross K/V (encoder-decoder)
  std::vector<BlockCopy> copies;      // applied to the KV storage before the step runs

  int num_seqs() const { return static_cast<int>(past_len.size()); }
  int64_t num_tokens(int s) const { return token_begin[s + 1] - token_begin[s]; }
  int64_t total_tokens() const { return token_begin.empty() ? 0 : token_begin.back(); }
  std::span<const int32_t> blocks(int s) const {
    return {block_table.data() + static_cast<size_t>(s) * max_blocks,
            static_cast<size_t>(max_blocks)};
  }

  void clear();
  // Appends a sequence of `tokens` rows; `blocks` may be shorter than max_blocks (padded).
  void add_sequence(int64_t tokens, int64_t past, std::span<const int32_t> blocks,
                    const CrossKv* cross_kv);
  // Throws naming the first inconsistency (used by backends before trusting the layout).
  void check(int block_size) const;
};

// Takes a graph's streamed outputs (Graph::streams_output: outputs the plan pooled with the
// step's activations) as the nodes write them. A T5 encoder's 24 cross K/V projections of a
// batch-16 prompt step are 34 MB of f32; each is copied out to the requests' cross K/V as it is
// written, so that they share a buffer instead of all living in the workspace until the end.
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // Output `output` (its position in graph.outputs), in the backend's memory: valid during this
  // call only (a later node of the step may overwrite it).
  virtual void take(int output, const Tensor& value) = 0;
};

struct StepContext {
  const StepLayout* layout = nullptr;
  KvStorage* kv = nullptr;  // cached self attention only
  // The step before this one is not read yet: its tokens feed this step where they live
  // (TokenSelector::start_argmax_rows) and are read after this step is queued. A backend that runs
  // ahead leaves that step's check pending instead of waiting for it here; its errors are then
  // reported by the read.
  bool behind_unread = false;
  // Nothing on the host reads this step's results: the next step reads them where they are (a
  // batch's encoder, whose cross K/V the first decode step attends to). A backend that runs ahead
  // returns without waiting for it and leaves its check to the next read.
  bool read_on_device = false;
  // Required by a graph that streams outputs; they are undefined in what execute() returns.
  OutputSink* sink = nullptr;
};

}  // namespace kiln
