#include "runtime/forward.h"

#include <algorithm>
#include <cstring>

#include "runtime/encoder_run.h"
#include "runtime/kv_cache.h"

namespace kiln {

namespace {

// The decoder over `cross` (one sequence's cross K/V; unused by decoder-only models).
void run_decoder(const ForwardModel& m, const CrossKv& cross,
                 const std::vector<int64_t>& decoder_ids, bool step_by_step, Forward& f) {
  const ModelDesc& d = m.model.desc;
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
}

// A CompiledModel's graphs, with the KV cache in the type the decoder's attention computes in
// (the plan's precision), or the one the backend narrows it to, as the scheduler's does (CPU
// bf16 and int8-weight plans: bf16).
ForwardModel forward_model(CompiledModel& engine) {
  ForwardModel m{engine.model(), engine.backend(),
                 engine.desc().encoder_decoder ? &engine.encoder() : nullptr, engine.decoder()};
  m.kv_dtype = engine.kv_cache_dtype();
  return m;
}

// The encoder graph's nodes that depend on its encoder_hidden output, with that value as the
// only input and each layer's cross K then V as outputs (EncoderIo's order, input at 0).
Graph cross_projections(const Graph& enc, int layers) {
  const int hidden = enc.outputs.at(static_cast<size_t>(enc.output_index("encoder_hidden")));
  Graph g = enc;  // values (weights shared, not copied) and the memory plan's slots
  g.name = enc.name + ".cross_kv";
  g.nodes.clear();
  std::vector<bool> derived(enc.values.size(), false);
  derived[static_cast<size_t>(hidden)] = true;
  for (Value& v : g.values) v.producer = -1;
  for (const Node& n : enc.nodes) {
    bool reads = false;
    for (int in : n.inputs) reads = reads || (in >= 0 && derived[static_cast<size_t>(in)]);
    if (!reads) continue;
    for (int in : n.inputs)
      KILN_CHECK(in < 0 || derived[static_cast<size_t>(in)] ||
                     enc.values[static_cast<size_t>(in)].kind == ValueKind::kWeight,
                 "graph '{}': node '{}' reads encoder_hidden and '{}', which is neither a weight "
                 "nor computed from encoder_hidden: the cross projections cannot run alone",
                 enc.name, n.name, enc.values[static_cast<size_t>(in)].name);
    for (int out : n.outputs) {
      derived[static_cast<size_t>(out)] = true;
      g.values[static_cast<size_t>(out)].producer = static_cast<int>(g.nodes.size());
    }
    g.nodes.push_back(n);
  }
  g.values[static_cast<size_t>(hidden)].kind = ValueKind::kInput;
  g.inputs = {hidden};
  g.outputs.clear();
  for (int l = 0; l < layers; ++l)
    for (const char* kv : {"cross_k.", "cross_v."}) {
      const int v = enc.outputs.at(static_cast<size_t>(enc.output_index(kv + std::to_string(l))));
      KILN_CHECK(derived[static_cast<size_t>(v)],
                 "graph '{}': {}{} is not computed from "
                 "encoder_hidden",
                 enc.name, kv, l);
      g.outputs.push_back(v);
    }
  if (!g.value_slot.empty()) g.value_slot[static_cast<size_t>(hidden)] = -1;
  return g;
}

}  // namespace

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
  run_decoder(m, cross, decoder_ids, step_by_step, f);
  return f;
}

Forward run_forward(CompiledModel& engine, const std::vector<int64_t>& prompt,
                    const std::vector<int64_t>& decoder_ids, bool step_by_step) {
  return run_forward(forward_model(engine), prompt, decoder_ids, step_by_step);
}

DecoderOnStates::DecoderOnStates(CompiledModel& engine)
    : engine_(engine), model_(forward_model(engine)) {
  const ModelDesc& d = engine.desc();
  KILN_CHECK_USAGE(d.encoder_decoder,
                   "the decoder alone on given encoder states: this plan has no encoder");
  graph_ = cross_projections(engine.model().graph(kEncoderGraph), static_cast<int>(d.cache_layers));
  const Graph* graphs[] = {&graph_};
  engine.backend().load_weights(graphs);
  exe_ = engine.backend().compile(graph_, engine.model().profile);
  // The graph's one input, then every layer's K and V (cross_projections' order).
  io_.input_ids = 0;
  io_.hidden = -1;
  for (int l = 0; l < static_cast<int>(d.cache_layers); ++l) {
    io_.cross_k.push_back(2 * l);
    io_.cross_v.push_back(2 * l + 1);
  }
}

DecoderOnStates::~DecoderOnStates() = default;

Forward DecoderOnStates::run(const Tensor& encoder_hidden,
                             const std::vector<int64_t>& decoder_ids) {
  const Value& in = graph_.values[static_cast<size_t>(graph_.inputs[0])];
  const int64_t width = in.shape.back().value;
  KILN_CHECK_USAGE(
      encoder_hidden.rank() == 2 && encoder_hidden.dim(1) == width && encoder_hidden.dim(0) > 0,
      "encoder states are {}, the plan's encoder writes [tokens, {}]",
      shape_str(encoder_hidden.shape()), width);
  KILN_CHECK_USAGE(encoder_hidden.dim(0) <= engine_.model().profile.max_step_tokens,
                   "{} encoder states, the plan's steps take at most {} tokens",
                   encoder_hidden.dim(0), engine_.model().profile.max_step_tokens);
  StepLayout layout;
  layout.clear();
  layout.add_sequence(encoder_hidden.dim(0), 0, {}, nullptr);
  // Host inputs, as the scheduler's steps give input_ids: the executable moves them.
  const Tensor inputs[] = {encoder_hidden.dtype() == in.dtype ? encoder_hidden
                                                              : encoder_hidden.to(in.dtype)};
  const std::shared_ptr<CrossKv> cross =
      run_encoder(*exe_, graph_, io_, engine_.backend(), engine_.model().precision, inputs,
                  StepContext{&layout, nullptr})
          .at(0);
  Forward f;
  f.encoder_hidden = encoder_hidden;
  run_decoder(model_, *cross, decoder_ids, false, f);
  return f;
}

}  // namespace kiln
