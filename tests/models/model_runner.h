// Drives a CompiledModel's graphs directly (no Scheduler) to get full-sequence logits, the way
// HF's forward pass computes them, optionally one token per step through the paged KV cache.
#pragma once

#include <cstring>

#include "runtime/compiled_model.h"
#include "runtime/kv_cache.h"

namespace kiln::test {

struct Forward {
  Tensor encoder_hidden;  // T5 only
  Tensor logits;          // [decoder tokens, vocab]
};

// T5: encodes `prompt`, then teacher-forces `decoder_ids`. BLOOM: `prompt` is ignored and
// `decoder_ids` is the whole sequence. step_by_step feeds one token per decoder call.
inline Forward run_forward(CompiledModel& engine, const std::vector<int64_t>& prompt,
                           const std::vector<int64_t>& decoder_ids, bool step_by_step) {
  const ModelDesc& d = engine.desc();
  Forward f;
  CrossKv cross;
  if (d.encoder_decoder) {
    const Graph& enc = engine.model().graph(kEncoderGraph);
    StepLayout layout;
    layout.clear();
    layout.add_sequence(static_cast<int64_t>(prompt.size()), 0, {}, nullptr);
    std::vector<Tensor> in(enc.inputs.size());
    in[engine.encoder_io().input_ids] =
        Tensor::from_vector(prompt, {static_cast<int64_t>(prompt.size())});
    StepContext step{&layout, nullptr};
    const std::span<const Tensor> out = engine.encoder().execute(in, &step);
    f.encoder_hidden = out[enc.output_index("encoder_hidden")].clone();
    for (int l = 0; l < d.cache_layers; ++l) {
      cross.keys.push_back(out[engine.encoder_io().cross_k[l]].clone());
      cross.values.push_back(out[engine.encoder_io().cross_v[l]].clone());
    }
  }
  KvGeometry geo{d.cache_layers, d.cache_row_width(), 4, DType::kF32};
  auto storage = engine.backend().create_kv_storage(geo);
  BlockManager blocks(*storage);
  SequenceKv kv;
  const int64_t n = static_cast<int64_t>(decoder_ids.size());
  f.logits = Tensor::empty(DType::kF32, {n, d.vocab_size});
  const int64_t chunk = step_by_step ? 1 : n;
  const Graph& dec = engine.model().graph(kDecoderGraph);
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    StepLayout layout;
    layout.clear();
    kv.prepare_append(blocks, len, &layout.copies);
    layout.add_sequence(len, kv.length(), kv.blocks(), &cross);
    std::vector<int64_t> ids(decoder_ids.begin() + begin, decoder_ids.begin() + begin + len);
    std::vector<int64_t> rows(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) rows[i] = i;
    std::vector<Tensor> in(dec.inputs.size());
    in[engine.decoder_io().input_ids] = Tensor::from_vector(ids, {len});
    in[engine.decoder_io().logit_rows] = Tensor::from_vector(rows, {len});
    StepContext step{&layout, storage.get()};
    const Tensor& logits = engine.decoder().execute(in, &step)[engine.decoder_io().logits];
    kv.commit(len);
    std::memcpy(f.logits.data<float>() + begin * d.vocab_size, logits.data<float>(),
                logits.nbytes());
  }
  kv.release(blocks);
  return f;
}

}  // namespace kiln::test
