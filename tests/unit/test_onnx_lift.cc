// Lifting the fixture exports (../shared/fixtures/onnx: a BLOOM causal LM, a T5 encoder and a T5
// decoder without past, from torch.onnx.export) into generation plans: the lifted plan's outputs
// match the ONNX interpreter's (the generic path) and onnxruntime's (reference.safetensors)
// within 1e-4 relative to max |value| at non-padded positions, and greedy generation through the
// plan's KV cache (the scheduler, several sequences batched) gives the ids of greedy decoding
// that re-runs the whole exported graph every step through the interpreter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "builder/builder.h"
#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/lift_ops.h"
#include "frontend/onnx/onnx_frontend.h"
#include "frontend/onnx/run_import_graph.h"
#include "io/safetensors.h"
#include "onnx_lift_util.h"
#include "onnx_test_models.h"
#include "runtime/forward.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

using namespace lift_test;  // NOLINT: the helpers of this test family

constexpr int64_t kSteps = 10;

// Plain greedy, and greedy where no token repeats (no_repeat_ngram_size 1): the random fixture
// models repeat one token under plain greedy, so the second makes every step's id different and
// depend on the cache's earlier positions.
class OnnxLiftGreedy : public ::testing::TestWithParam<bool> {
 protected:
  Context ctx_{ContextOptions{LogLevel::kWarning, 2}};
  GenerationParams params() const {
    GenerationParams p;
    p.max_new_tokens = kSteps;
    p.ignore_eos = true;  // a random model: compare every step, EOS or not
    p.no_repeat_ngram_size = GetParam() ? 1 : 0;
    return p;
  }
};

class OnnxLift : public ::testing::Test {
 protected:
  Context ctx_{ContextOptions{LogLevel::kWarning, 2}};
};

TEST_F(OnnxLift, BloomPlanMatchesInterpreterAndOnnxruntime) {
  const auto engine = compile(ctx_, {"bloom.onnx"}, kBloomTokenizer);
  EXPECT_FALSE(engine->desc().encoder_decoder);
  const ImportGraph graph = import("bloom.onnx");
  const Tensor& ids = fx("bloom.in.input_ids");
  const Tensor& mask = fx("bloom.in.attention_mask");
  const std::map<std::string, ImportTensor> in = {
      {"input_ids", ImportTensor::from_tensor(OnnxElemType::kInt64, ids)},
      {"attention_mask", ImportTensor::from_tensor(OnnxElemType::kInt64, mask)}};
  const std::vector<float> interp = run_import_graph(graph, in).at("logits").to_floats();
  const std::vector<float> ort = floats(fx("bloom.out.logits"));
  const int64_t s = ids.dim(1), vocab = engine->desc().vocab_size;
  ASSERT_EQ(static_cast<int64_t>(ort.size()), ids.dim(0) * s * vocab);
  Error_ vs_interp, vs_ort;
  for (int64_t r = 0; r < ids.dim(0); ++r) {
    for (bool step : {false, true}) {
      const Forward f = run_forward(*engine, {}, real_tokens(ids, mask, r), step);
      accumulate(vs_interp, interp, s, vocab, r, positions_of(mask, r), f.logits);
      accumulate(vs_ort, ort, s, vocab, r, positions_of(mask, r), f.logits);
    }
  }
  report("bloom logits, plan vs interpreter", vs_interp);
  report("bloom logits, plan vs onnxruntime", vs_ort);
}

TEST_F(OnnxLift, T5PlanMatchesInterpreterAndOnnxruntime) {
  const auto engine = compile(ctx_, {"t5_encoder.onnx", "t5_decoder.onnx"}, kT5Tokenizer);
  ASSERT_TRUE(engine->desc().encoder_decoder);
  const ImportGraph enc = import("t5_encoder.onnx"), dec = import("t5_decoder.onnx");
  const Tensor& ids = fx("t5_encoder.in.input_ids");
  const Tensor& mask = fx("t5_encoder.in.attention_mask");
  const Tensor& dec_ids = fx("t5_decoder.in.input_ids");
  // The decoder export's inputs are the encoder's states for the same prompts.
  ASSERT_EQ(ints(fx("t5_decoder.in.encoder_attention_mask")), ints(mask));
  const std::vector<float> interp_hidden =
      run_import_graph(enc,
                       {{"input_ids", ImportTensor::from_tensor(OnnxElemType::kInt64, ids)},
                        {"attention_mask", ImportTensor::from_tensor(OnnxElemType::kInt64, mask)}})
          .at("last_hidden_state")
          .to_floats();
  std::map<std::string, ImportTensor> dec_in;
  for (const char* name : {"input_ids", "encoder_hidden_states", "encoder_attention_mask"}) {
    const Tensor& t = fx(std::string("t5_decoder.in.") + name);
    dec_in[name] = ImportTensor::from_tensor(
        t.dtype() == DType::kF32 ? OnnxElemType::kFloat : OnnxElemType::kInt64, t);
  }
  const std::vector<float> interp_logits = run_import_graph(dec, dec_in).at("logits").to_floats();
  const std::vector<float> ort_hidden = floats(fx("t5_encoder.out.last_hidden_state"));
  const std::vector<float> ort_logits = floats(fx("t5_decoder.out.logits"));
  const int64_t s = ids.dim(1), t = dec_ids.dim(1), vocab = engine->desc().vocab_size;
  const int64_t d = static_cast<int64_t>(ort_hidden.size()) / (ids.dim(0) * s);
  Error_ h_interp, h_ort, l_interp, l_ort;
  for (int64_t r = 0; r < ids.dim(0); ++r) {
    const std::vector<int64_t> row(dec_ids.data<int64_t>() + r * t,
                                   dec_ids.data<int64_t>() + (r + 1) * t);
    std::vector<int64_t> all(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) all[i] = i;
    for (bool step : {false, true}) {
      const Forward f = run_forward(*engine, real_tokens(ids, mask, r), row, step);
      accumulate(h_interp, interp_hidden, s, d, r, positions_of(mask, r), f.encoder_hidden);
      accumulate(h_ort, ort_hidden, s, d, r, positions_of(mask, r), f.encoder_hidden);
      accumulate(l_interp, interp_logits, t, vocab, r, all, f.logits);
      accumulate(l_ort, ort_logits, t, vocab, r, all, f.logits);
    }
  }
  report("t5 encoder states, plan vs interpreter", h_interp);
  report("t5 encoder states, plan vs onnxruntime", h_ort);
  report("t5 decoder logits, plan vs interpreter", l_interp);
  report("t5 decoder logits, plan vs onnxruntime", l_ort);
}

// bloom.onnx with every LayerNormalization node written as torch exports LayerNorm before
// opset 17: ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul scale, Add bias.
std::string bloom_with_decomposed_layer_norms(const std::string& dir, int* replaced) {
  std::ifstream in(kOnnxDir + "/bloom.onnx", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  ::onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(bytes.str()));
  ::onnx::GraphProto* g = m.mutable_graph();
  const auto nodes = g->node();
  g->clear_node();
  *replaced = 0;
  for (const ::onnx::NodeProto& n : nodes) {
    if (n.op_type() != "LayerNormalization") {
      *g->add_node() = n;
      continue;
    }
    float eps = 1e-5f;
    for (const auto& a : n.attribute())
      if (a.name() == "epsilon") eps = a.f();
    const std::string p = n.name() + "/decomposed/", x = n.input(0);
    onnx_test::add_raw_float(g, p + "two", {}, {2.0f});
    onnx_test::add_raw_float(g, p + "eps", {}, {eps});
    auto mean = [&](const std::string& name, const std::string& from, const std::string& to) {
      auto* r = onnx_test::add_node(g, "ReduceMean", p + name, {from}, {to});
      auto* axes = r->add_attribute();
      axes->set_name("axes");
      axes->set_type(::onnx::AttributeProto::INTS);
      axes->add_ints(-1);
    };
    mean("mean", x, p + "mean");
    onnx_test::add_node(g, "Sub", p + "sub", {x, p + "mean"}, {p + "d"});
    onnx_test::add_node(g, "Pow", p + "pow", {p + "d", p + "two"}, {p + "d2"});
    mean("var", p + "d2", p + "var");
    onnx_test::add_node(g, "Add", p + "add_eps", {p + "var", p + "eps"}, {p + "ve"});
    onnx_test::add_node(g, "Sqrt", p + "sqrt", {p + "ve"}, {p + "s"});
    onnx_test::add_node(g, "Div", p + "div", {p + "d", p + "s"}, {p + "n"});
    onnx_test::add_node(g, "Mul", p + "scale", {p + "n", n.input(1)}, {p + "m"});
    onnx_test::add_node(g, "Add", p + "bias", {p + "m", n.input(2)}, {n.output(0)});
    ++*replaced;
  }
  return onnx_test::write_model(m, dir + "/bloom_decomposed.onnx");
}

TEST_F(OnnxLift, DecomposedLayerNormsLift) {
  int replaced = 0;
  const std::string path = bloom_with_decomposed_layer_norms(onnx_test::test_dir(), &replaced);
  ASSERT_EQ(replaced, 6);
  const ImportGraph graph = ImportGraph::build(read_onnx_model(path));
  const PatternGraph pattern(graph, lift_probe_shapes(graph));
  const LiftResult lifted = lift_import_graph(pattern, ctx_.log());
  int norms = 0;
  for (const LiftedOp& op : lifted.ops) norms += op.kind == LiftedKind::kLayerNorm ? 1 : 0;
  EXPECT_EQ(norms, replaced);
  CompiledModel engine(ctx_,
                       build_model_from_onnx({path}, kBloomTokenizer, BuildOptions{}, ctx_.log()));
  check_bloom_plan(engine, graph, "bloom (decomposed norms) logits", true);
}

// Greedy ids of re-running the whole BLOOM export on the sequence so far, every step.
std::vector<int64_t> bloom_rerun_greedy(const ImportGraph& graph, std::vector<int64_t> seq,
                                        int64_t vocab, bool no_repeat) {
  std::vector<int64_t> generated;
  for (int64_t step = 0; step < kSteps; ++step) {
    const int64_t n = static_cast<int64_t>(seq.size());
    const auto out =
        run_import_graph(graph, {{"input_ids", int_tensor(seq)}, {"attention_mask", ones(n)}});
    const int64_t next = argmax_last(out.at("logits").to_floats(), vocab, seq, no_repeat);
    generated.push_back(next);
    seq.push_back(next);
  }
  return generated;
}

TEST_P(OnnxLiftGreedy, BloomKvCacheMatchesInterpreterRerun) {
  const auto engine = compile(ctx_, {"bloom.onnx"}, kBloomTokenizer);
  const ImportGraph graph = import("bloom.onnx");
  const Tensor& ids = fx("bloom.in.input_ids");
  const Tensor& mask = fx("bloom.in.attention_mask");
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < ids.dim(0); ++r) prompts.push_back(real_tokens(ids, mask, r));
  Scheduler gen(*engine);
  const auto batched = gen.generate(prompts, params());  // the prompts decode as one batch
  ASSERT_EQ(batched.size(), prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r) {
    const std::vector<int64_t> want =
        bloom_rerun_greedy(graph, prompts[r], engine->desc().vocab_size, GetParam());
    EXPECT_EQ(batched[r].output_ids, want) << "prompt " << r;
    EXPECT_EQ(static_cast<int64_t>(want.size()), kSteps);
    std::printf("[ lift     ] bloom prompt %zu%s: greedy ids %s\n", r,
                GetParam() ? " (no repeats)" : "", ::testing::PrintToString(want).c_str());
  }
}

TEST_P(OnnxLiftGreedy, T5KvCacheMatchesInterpreterRerun) {
  const auto engine = compile(ctx_, {"t5_encoder.onnx", "t5_decoder.onnx"}, kT5Tokenizer);
  const ImportGraph enc = import("t5_encoder.onnx"), dec = import("t5_decoder.onnx");
  const Tensor& ids = fx("t5_encoder.in.input_ids");
  const Tensor& mask = fx("t5_encoder.in.attention_mask");
  const int64_t vocab = engine->desc().vocab_size;
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < ids.dim(0); ++r) prompts.push_back(real_tokens(ids, mask, r));
  Scheduler gen(*engine);
  const auto batched = gen.generate(prompts, params());
  ASSERT_EQ(batched.size(), prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r) {
    const int64_t n = static_cast<int64_t>(prompts[r].size());
    const auto states =
        run_import_graph(enc, {{"input_ids", int_tensor(prompts[r])}, {"attention_mask", ones(n)}});
    std::vector<int64_t> seq = {engine->desc().decoder_start_token_id}, want;
    for (int64_t step = 0; step < kSteps; ++step) {
      const auto out =
          run_import_graph(dec, {{"input_ids", int_tensor(seq)},
                                 {"encoder_hidden_states", states.at("last_hidden_state")},
                                 {"encoder_attention_mask", ones(n)}});
      want.push_back(argmax_last(out.at("logits").to_floats(), vocab, seq, GetParam()));
      seq.push_back(want.back());
    }
    EXPECT_EQ(batched[r].output_ids, want) << "prompt " << r;
    std::printf("[ lift     ] t5 prompt %zu%s: greedy ids %s\n", r,
                GetParam() ? " (no repeats)" : "", ::testing::PrintToString(want).c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(PlainAndNoRepeat, OnnxLiftGreedy, ::testing::Bool());

}  // namespace
}  // namespace kiln
