#include "runtime/forward.h"

#include <algorithm>
#include <cstring>

#include "runtime/encoder_run.h"
#include "runtime/kv_cache.h"

namespace kiln {

Forward run_forward(const ForwardModel& m, const std::vector<int64_t>& prompt,
                    const std::vector<int64_t>& decoder_ids, bool step_by_step) {
  const ModelDesc& d = m.model.desc;
  Forward f;
  CrossKv cross;
  if (d.encoder_decoder) {
    const Graph& enc = m.model.graph(kEncoderGraph);
    StepLayout layout;
    layout.clear();
    layout.add_sequence(static_cast<int64_t>(prompt.size()), 0, {}, nullptr);
    const EncoderIo io = EncoderIo::of(enc, d.cache_layers);
    std::vector<Tensor> in(enc.inputs.size());
    in[io.input_ids] = Tensor::from_vector(prompt, {static_cast<int64_t>(prompt.size())});
    // Cross K/V where the backend's kernels read them (device memory for CUDA), in the type the
    // scheduler keeps them in (the CPU's bf16 and int8-weight plans: bf16), as the scheduler
    // makes them; the states copied to the host.
    cross = *run_encoder(*m.encoder, enc, io, m.backend, m.model.precision, in,
                         StepContext{&layout, nullptr}, &f.encoder_hidden)
                 .at(0);
  }
  KvGeometry geo{d.cache_layers, d.cache_row_width(), 4, m.kv_dtype};
  auto storage = m.backend.create_kv_storage(geo);
  BlockManager blocks(*storage);
  SequenceKv kv;
  const int64_t n = static_cast<int64_t>(decoder_ids.size());
  f.logits = Tensor::empty(DType::kF32, {n, d.vocab_size});
  const int64_t chunk = step_by_step ? 1 : n;
  const Graph& dec = m.model.graph(kDecoderGraph);
  const int ids_at = dec.input_index("input_ids"), rows_at = dec.input_index("logit_rows");
  const int logits_at = dec.output_index("logits");
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
    in[ids_at] = Tensor::from_vector(ids, {len});
    in[rows_at] = Tensor::from_vector(rows, {len});
    StepContext step{&layout, storage.get()};
    const Tensor logits = m.backend.allocator().to_host(m.decoder.execute(in, &step)[logits_at]);
    kv.commit(len);
    std::memcpy(f.logits.data<float>() + begin * d.vocab_size, logits.data<float>(),
                logits.nbytes());
  }
  kv.release(blocks);
  return f;
}

Forward run_forward(CompiledModel& engine, const std::vector<int64_t>& prompt,
                    const std::vector<int64_t>& decoder_ids, bool step_by_step) {
  ForwardModel m{engine.model(), engine.backend(),
                 engine.desc().encoder_decoder ? &engine.encoder() : nullptr, engine.decoder()};
  // The cache holds K/V in the type the decoder's attention computes in (the plan's precision),
  // or the one the backend narrows it to, as the scheduler's does (CPU bf16 and int8-weight
  // plans: bf16).
  const Graph& dec = engine.model().graph(kDecoderGraph);
  for (const Node& n : dec.nodes)
    if (n.op == OpKind::kAttention && n.attr<AttentionAttrs>().kind == AttentionKind::kCachedSelf) {
      m.kv_dtype = dec.values[n.inputs[0]].dtype;
      break;
    }
  m.kv_dtype = engine.backend().kv_cache_dtype(m.kv_dtype, engine.model().precision);
  return run_forward(m, prompt, decoder_ids, step_by_step);
}

}  // namespace kiln
