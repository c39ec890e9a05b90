// Drives an Engine's graphs directly (no Generator) to get full-sequence logits, the way HF's
// forward pass computes them, optionally one token per step through the paged KV cache.
#pragma once

#include "kiln/engine.h"
#include "runtime/kv_cache.h"

namespace kiln::test {

struct Forward {
  Tensor encoder_hidden;  // T5 only
  Tensor logits;          // [decoder tokens, vocab]
};

// T5: encodes `prompt`, then teacher-forces `decoder_ids`. BLOOM: `prompt` is ignored and
// `decoder_ids` is the whole sequence. step_by_step feeds one token per decoder call.
inline Forward run_forward(Engine& engine, const std::vector<int64_t>& prompt,
                           const std::vector<int64_t>& decoder_ids, bool step_by_step) {
  const ModelIR& m = engine.model();
  Forward f;
  CrossKv cross;
  if (m.is_encoder_decoder()) {
    AttentionBatch batch;
    batch.seqs.push_back(SequenceSlot{0, static_cast<int64_t>(prompt.size()), 0, {}, nullptr});
    TensorMap in{{"input_ids", Tensor::from_vector(prompt, {static_cast<int64_t>(prompt.size())})}};
    TensorMap out = engine.encoder().execute(in, &batch);
    f.encoder_hidden = out.at("encoder_hidden");
    for (int l = 0; l < m.cache_layers(); ++l) {
      cross.keys.push_back(out.at("cross_k." + std::to_string(l)));
      cross.values.push_back(out.at("cross_v." + std::to_string(l)));
    }
  }
  PagedKvCache cache(m.cache_layers(), m.cache_row_width(), 4);
  SequenceKv kv;
  const int64_t n = static_cast<int64_t>(decoder_ids.size());
  f.logits = Tensor::empty(DType::kF32, {n, m.vocab_size()});
  const int64_t chunk = step_by_step ? 1 : n;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    kv.prepare_append(cache, len);
    AttentionBatch batch;
    batch.cache = &cache;
    batch.seqs.push_back(SequenceSlot{0, len, kv.length(), kv.blocks(), &cross});
    std::vector<int64_t> ids(decoder_ids.begin() + begin, decoder_ids.begin() + begin + len);
    std::vector<int64_t> rows(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) rows[i] = i;
    TensorMap in{{"input_ids", Tensor::from_vector(ids, {len})},
                 {"logit_rows", Tensor::from_vector(rows, {len})}};
    const Tensor logits = engine.decoder().execute(in, &batch).at("logits");
    kv.commit(len);
    std::memcpy(f.logits.data<float>() + begin * m.vocab_size(), logits.data<float>(),
                logits.nbytes());
  }
  kv.release(cache);
  return f;
}

}  // namespace kiln::test
