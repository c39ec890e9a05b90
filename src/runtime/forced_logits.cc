#include "runtime/forced_logits.h"

#include <cstring>

#include "runtime/encoder_run.h"
#include "runtime/kv_cache.h"

namespace kiln {
namespace {

void check_sequence(const CompiledModel& model, const ForcedSequence& s) {
  const ModelDesc& d = model.desc();
  const int64_t n = static_cast<int64_t>(s.decoder_ids.size());
  KILN_CHECK(n > 0 && s.first_row >= 0 && s.first_row < n,
             "forced logits: rows {}.. of a {}-token decoder sequence", s.first_row, n);
  KILN_CHECK(d.encoder_decoder != s.prompt.empty(), "forced logits: an {} model takes {}",
             d.encoder_decoder ? "encoder-decoder" : "decoder-only",
             d.encoder_decoder ? "a prompt for its encoder" : "no separate prompt");
  const ShapeProfile& p = model.model().profile;
  KILN_CHECK(n <= p.max_step_tokens && static_cast<int64_t>(s.prompt.size()) <= p.max_step_tokens,
             "forced logits: a sequence of {} tokens (prompt {}) exceeds the plan's steps of {}", n,
             s.prompt.size(), p.max_step_tokens);
  KILN_CHECK(n - s.first_row <= p.max_batch,
             "forced logits: {} rows of logits asked for; a step of the plan holds at most {}",
             n - s.first_row, p.max_batch);
}

// One step's sequences, sequences[begin, end): encoder, then decoder; logits into out[i].
void run_group(CompiledModel& model, std::span<const ForcedSequence> group, KvStorage& storage,
               std::span<Tensor> out) {
  const ModelDesc& d = model.desc();
  std::vector<std::shared_ptr<CrossKv>> cross(group.size());
  if (d.encoder_decoder) {
    const Graph& enc = model.model().graph(kEncoderGraph);
    StepLayout layout;
    layout.clear();
    std::vector<int64_t> ids;
    for (const ForcedSequence& s : group) {
      layout.add_sequence(static_cast<int64_t>(s.prompt.size()), 0, {}, nullptr);
      ids.insert(ids.end(), s.prompt.begin(), s.prompt.end());
    }
    std::vector<Tensor> in(enc.inputs.size());
    in[model.encoder_io().input_ids] = Tensor::from_vector(ids, {static_cast<int64_t>(ids.size())});
    cross = run_encoder(model.encoder(), enc, model.encoder_io(), model.backend(),
                        model.model().precision, in, StepContext{&layout, nullptr});
  }
  BlockManager blocks(storage);
  std::vector<SequenceKv> kv(group.size());
  StepLayout layout;
  layout.clear();
  std::vector<int64_t> ids, rows;
  for (size_t i = 0; i < group.size(); ++i) {
    const ForcedSequence& s = group[i];
    const int64_t n = static_cast<int64_t>(s.decoder_ids.size());
    const int64_t offset = static_cast<int64_t>(ids.size());
    kv[i].prepare_append(blocks, n, &layout.copies);
    layout.add_sequence(n, 0, kv[i].blocks(), cross[i].get());
    ids.insert(ids.end(), s.decoder_ids.begin(), s.decoder_ids.end());
    for (int64_t r = s.first_row; r < n; ++r) rows.push_back(offset + r);
  }
  const Graph& dec = model.model().graph(kDecoderGraph);
  std::vector<Tensor> in(dec.inputs.size());
  in[model.decoder_io().input_ids] = Tensor::from_vector(ids, {static_cast<int64_t>(ids.size())});
  in[model.decoder_io().logit_rows] =
      Tensor::from_vector(rows, {static_cast<int64_t>(rows.size())});
  StepContext step{&layout, &storage};
  const Tensor logits = model.backend().allocator().to_host(
      model.decoder().execute(in, &step)[model.decoder_io().logits]);
  const int64_t vocab = logits.dim(1);
  int64_t row = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    const int64_t n = static_cast<int64_t>(group[i].decoder_ids.size()) - group[i].first_row;
    out[i] = Tensor::empty(DType::kF32, {n, vocab});
    std::memcpy(out[i].raw(), logits.data<float>() + row * vocab, out[i].nbytes());
    row += n;
    kv[i].release(blocks);
  }
}

}  // namespace

std::vector<Tensor> forced_logits(CompiledModel& model, std::span<const ForcedSequence> sequences) {
  for (const ForcedSequence& s : sequences) check_sequence(model, s);
  const ModelDesc& d = model.desc();
  const ShapeProfile& profile = model.model().profile;
  KvGeometry geometry{d.cache_layers, d.cache_row_width(), 16, model.kv_cache_dtype()};
  std::unique_ptr<KvStorage> storage = model.backend().create_kv_storage(geometry);
  std::vector<Tensor> out(sequences.size());
  // Groups of consecutive sequences whose encoder and decoder tokens each fit one step, and
  // whose logits rows the step's workspace holds (at most max_batch rows).
  size_t begin = 0;
  while (begin < sequences.size()) {
    size_t end = begin;
    int64_t enc = 0, dec = 0, rows = 0;
    while (end < sequences.size()) {
      const ForcedSequence& s = sequences[end];
      const int64_t n = static_cast<int64_t>(s.decoder_ids.size());
      const bool fits = enc + static_cast<int64_t>(s.prompt.size()) <= profile.max_step_tokens &&
                        dec + n <= profile.max_step_tokens &&
                        rows + n - s.first_row <= profile.max_batch &&
                        static_cast<int64_t>(end - begin) < profile.max_batch;
      if (end > begin && !fits) break;
      enc += static_cast<int64_t>(s.prompt.size());
      dec += n;
      rows += n - s.first_row;
      ++end;
    }
    run_group(model, sequences.subspan(begin, end - begin), *storage,
              std::span<Tensor>(out).subspan(begin, end - begin));
    begin = end;
  }
  return out;
}

Tensor forced_logits(CompiledModel& model, const ForcedSequence& sequence) {
  return std::move(forced_logits(model, std::span<const ForcedSequence>(&sequence, 1)).at(0));
}

}  // namespace kiln
