#include "runtime/forced_logits.h"

#include "runtime/encoder_run.h"
#include "runtime/kv_cache.h"

namespace kiln {
namespace {

// The type the decoder's self-attention caches K/V in (its input's), as the backend keeps it
// for the plan's precision: what the scheduler allocates.
DType kv_dtype(CompiledModel& model) {
  const Graph& dec = model.model().graph(kDecoderGraph);
  DType compute = DType::kF32;
  for (const Node& n : dec.nodes)
    if (n.op == OpKind::kAttention && n.attr<AttentionAttrs>().kind == AttentionKind::kCachedSelf) {
      compute = dec.values[n.inputs[0]].dtype;
      break;
    }
  return model.backend().kv_cache_dtype(compute, model.model().precision);
}

}  // namespace

Tensor forced_logits(CompiledModel& model, const ForcedSequence& sequence) {
  const ModelDesc& d = model.desc();
  const int64_t n = static_cast<int64_t>(sequence.decoder_ids.size());
  KILN_CHECK(n > 0 && sequence.first_row >= 0 && sequence.first_row < n,
             "forced logits: rows {}.. of a {}-token decoder sequence", sequence.first_row, n);
  KILN_CHECK(d.encoder_decoder != sequence.prompt.empty(), "forced logits: an {} model takes {}",
             d.encoder_decoder ? "encoder-decoder" : "decoder-only",
             d.encoder_decoder ? "a prompt for its encoder" : "no separate prompt");
  const ShapeProfile& profile = model.model().profile;
  KILN_CHECK(n <= profile.max_step_tokens &&
                 static_cast<int64_t>(sequence.prompt.size()) <= profile.max_step_tokens,
             "forced logits: a sequence of {} tokens (prompt {}) exceeds the plan's steps of {}", n,
             sequence.prompt.size(), profile.max_step_tokens);
  std::shared_ptr<CrossKv> cross;
  if (d.encoder_decoder) {
    const Graph& enc = model.model().graph(kEncoderGraph);
    const int64_t len = static_cast<int64_t>(sequence.prompt.size());
    StepLayout layout;
    layout.clear();
    layout.add_sequence(len, 0, {}, nullptr);
    std::vector<Tensor> in(enc.inputs.size());
    in[model.encoder_io().input_ids] = Tensor::from_vector(sequence.prompt, {len});
    cross = run_encoder(model.encoder(), enc, model.encoder_io(), model.backend(),
                        model.model().precision, in, StepContext{&layout, nullptr})
                .at(0);
  }
  KvGeometry geometry{d.cache_layers, d.cache_row_width(), 16, kv_dtype(model)};
  std::unique_ptr<KvStorage> storage = model.backend().create_kv_storage(geometry);
  BlockManager blocks(*storage);
  SequenceKv kv;
  StepLayout layout;
  layout.clear();
  kv.prepare_append(blocks, n, &layout.copies);
  layout.add_sequence(n, kv.length(), kv.blocks(), cross.get());
  const int64_t rows = n - sequence.first_row;
  std::vector<int64_t> row_ids(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) row_ids[static_cast<size_t>(i)] = sequence.first_row + i;
  const Graph& dec = model.model().graph(kDecoderGraph);
  std::vector<Tensor> in(dec.inputs.size());
  in[model.decoder_io().input_ids] = Tensor::from_vector(sequence.decoder_ids, {n});
  in[model.decoder_io().logit_rows] = Tensor::from_vector(row_ids, {rows});
  StepContext step{&layout, storage.get()};
  Tensor logits = model.backend().allocator().to_host(
      model.decoder().execute(in, &step)[model.decoder_io().logits]);
  kv.commit(n);
  kv.release(blocks);
  return logits;
}

}  // namespace kiln
