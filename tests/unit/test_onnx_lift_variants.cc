// Lifting variants made from the fixture exports through the protobuf API, each checked against
// the ONNX interpreter running the same modified file: a BLOOM export whose lm_head is not the
// embedding (lifted as its own weight, not tied), and a T5 decoder that scales its output by
// d_model^-0.5 before lm_head (HF's tied T5) — the lifted config must follow the graph.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "onnx_lift_util.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

using namespace lift_test;  // NOLINT: the helpers of this test family

::onnx::ModelProto load(const std::string& file) {
  std::ifstream in(kOnnxDir + "/" + file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  ::onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(bytes.str()));
  return m;
}

// The node computing the graph output `name`.
::onnx::NodeProto* producer_of(::onnx::ModelProto& m, const std::string& name) {
  for (auto& n : *m.mutable_graph()->mutable_node())
    for (const std::string& o : n.output())
      if (o == name) return &n;
  return nullptr;
}

class OnnxLiftVariants : public ::testing::Test {
 protected:
  Context ctx_{ContextOptions{LogLevel::kWarning, 2}};
};

TEST_F(OnnxLiftVariants, BloomLmHeadOfItsOwn) {
  ::onnx::ModelProto m = load("bloom.onnx");
  ::onnx::NodeProto* head = producer_of(m, "logits");
  ASSERT_NE(head, nullptr);
  ASSERT_EQ(head->op_type(), "MatMul");
  int changed = 0;
  for (auto& t : *m.mutable_graph()->mutable_initializer()) {
    if (t.name() != head->input(1)) continue;
    ASSERT_FALSE(t.raw_data().empty());
    std::string raw = t.raw_data();
    std::vector<float> w(raw.size() / sizeof(float));
    std::memcpy(w.data(), raw.data(), raw.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = w[i] * 1.5f + 0.01f * static_cast<float>(i % 7);
    t.set_raw_data(std::string(reinterpret_cast<const char*>(w.data()), raw.size()));
    ++changed;
  }
  ASSERT_EQ(changed, 1) << "lm_head's weight is an initializer";
  const std::string path = onnx_test::write_model(m, onnx_test::test_dir() + "/bloom.onnx");
  const ModelIR model = build_model_from_onnx({path}, kBloomTokenizer, BuildOptions{}, ctx_.log());
  EXPECT_FALSE(nlohmann::json::parse(model.source_config_json).at("tie_word_embeddings"))
      << model.source_config_json;
  CompiledModel engine(ctx_, model);
  check_bloom_plan(engine, ImportGraph::build(read_onnx_model(path)), "bloom with its own lm_head",
                   false);
}

// Exporters with use_cache add outputs (present key/values) beside the logits: the plan keeps
// its own cache, so they are left out.
TEST_F(OnnxLiftVariants, ExtraOutputsAreLeftOut) {
  ::onnx::ModelProto m = load("bloom.onnx");
  ::onnx::NodeProto* head = producer_of(m, "logits");
  ASSERT_NE(head, nullptr);
  onnx_test::set_value_info(m.mutable_graph()->add_output(), head->input(0),
                            ::onnx::TensorProto::FLOAT, {"batch", "seq", 32});
  const std::string path = onnx_test::write_model(m, onnx_test::test_dir() + "/bloom.onnx");
  const ModelIR model = build_model_from_onnx({path}, kBloomTokenizer, BuildOptions{}, ctx_.log());
  EXPECT_FALSE(model.desc.encoder_decoder);
  // Without an output named logits, two outputs are ambiguous.
  for (auto& o : *m.mutable_graph()->mutable_output())
    if (o.name() == "logits") o.set_name("scores");
  head->set_output(0, "scores");
  const std::string renamed = onnx_test::write_model(m, onnx_test::test_dir() + "/renamed.onnx");
  onnx_test::expect_error(
      [&] { build_model_from_onnx({renamed}, kBloomTokenizer, BuildOptions{}, ctx_.log()); },
      {"no output named 'logits' among 'scores',"});
}

TEST_F(OnnxLiftVariants, T5DecoderOutputScaled) {
  ::onnx::ModelProto m = load("t5_decoder.onnx");
  const int64_t d_model = fx("t5_encoder.out.last_hidden_state").dim(2);
  auto* g = m.mutable_graph();
  const auto nodes = g->node();
  g->clear_node();
  int inserted = 0;
  onnx_test::add_raw_float(g, "kiln_test.output_scale", {},
                           {static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_model)))});
  for (const ::onnx::NodeProto& n : nodes) {
    ::onnx::NodeProto copy = n;
    if (n.output_size() == 1 && n.output(0) == "logits") {
      onnx_test::add_node(g, "Mul", "kiln_test.scale_output",
                          {n.input(0), "kiln_test.output_scale"}, {"kiln_test.scaled"});
      copy.set_input(0, "kiln_test.scaled");
      ++inserted;
    }
    *g->add_node() = copy;
  }
  ASSERT_EQ(inserted, 1);
  const std::string dir = onnx_test::test_dir();
  const std::string path = onnx_test::write_model(m, dir + "/t5_decoder.onnx");
  const ModelIR model = build_model_from_onnx({kOnnxDir + "/t5_encoder.onnx", path}, kT5Tokenizer,
                                              BuildOptions{}, ctx_.log());
  EXPECT_TRUE(nlohmann::json::parse(model.source_config_json).at("scale_decoder_outputs"))
      << model.source_config_json;
  CompiledModel engine(ctx_, model);
  const ImportGraph dec = ImportGraph::build(read_onnx_model(path));
  std::map<std::string, ImportTensor> in;
  for (const char* name : {"input_ids", "encoder_hidden_states", "encoder_attention_mask"}) {
    const Tensor& t = fx(std::string("t5_decoder.in.") + name);
    in[name] = ImportTensor::from_tensor(
        t.dtype() == DType::kF32 ? OnnxElemType::kFloat : OnnxElemType::kInt64, t);
  }
  const std::vector<float> interp = run_import_graph(dec, in).at("logits").to_floats();
  const Tensor& ids = fx("t5_encoder.in.input_ids");
  const Tensor& mask = fx("t5_encoder.in.attention_mask");
  const Tensor& dec_ids = fx("t5_decoder.in.input_ids");
  const int64_t t = dec_ids.dim(1);
  std::vector<int64_t> all(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) all[i] = i;
  Error_ e;
  for (int64_t r = 0; r < ids.dim(0); ++r) {
    const std::vector<int64_t> row(dec_ids.data<int64_t>() + r * t,
                                   dec_ids.data<int64_t>() + (r + 1) * t);
    accumulate(e, interp, t, engine.desc().vocab_size, r, all,
               run_forward(engine, real_tokens(ids, mask, r), row, false).logits);
  }
  report("t5 with a scaled decoder output, plan vs interpreter", e);
}

// BLOOM's QKV split as Slice + Squeeze (as other exporters write fused_qkv[..., i, :]) instead
// of TorchScript's Gather.
TEST_F(OnnxLiftVariants, BloomQkvSplitBySlice) {
  ::onnx::ModelProto m = load("bloom.onnx");
  auto* g = m.mutable_graph();
  const auto nodes = g->node();
  g->clear_node();
  int replaced = 0;
  auto ints = [&](const std::string& name, int64_t v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::INT64);
    t->add_dims(1);
    t->add_int64_data(v);
  };
  for (const ::onnx::NodeProto& n : nodes) {
    bool on_axis3 = false;
    for (const auto& a : n.attribute()) on_axis3 = on_axis3 || (a.name() == "axis" && a.i() == 3);
    if (n.op_type() != "Gather" || !on_axis3 ||
        n.name().find("self_attention") == std::string::npos) {
      *g->add_node() = n;
      continue;
    }
    // The index is a Constant node's scalar; find its value.
    int64_t index = -1;
    for (const ::onnx::NodeProto& c : nodes)
      if (c.op_type() == "Constant" && c.output(0) == n.input(1)) {
        const ::onnx::TensorProto& t = c.attribute(0).t();
        ASSERT_EQ(t.data_type(), ::onnx::TensorProto::INT64);
        std::memcpy(&index, t.raw_data().data(), sizeof index);
      }
    ASSERT_GE(index, 0) << n.name();
    const std::string p = n.name() + "/as_slice/";
    ints(p + "start", index);
    ints(p + "end", index + 1);
    ints(p + "axes", 3);
    onnx_test::add_node(g, "Slice", p + "slice", {n.input(0), p + "start", p + "end", p + "axes"},
                        {p + "sliced"});
    onnx_test::add_node(g, "Squeeze", p + "squeeze", {p + "sliced", p + "axes"}, {n.output(0)});
    ++replaced;
  }
  ASSERT_EQ(replaced, 6) << "q, k and v of two layers";
  const std::string path = onnx_test::write_model(m, onnx_test::test_dir() + "/bloom.onnx");
  CompiledModel engine(ctx_,
                       build_model_from_onnx({path}, kBloomTokenizer, BuildOptions{}, ctx_.log()));
  check_bloom_plan(engine, ImportGraph::build(read_onnx_model(path)),
                   "bloom with the QKV split by Slice", false);
}

// The attention mask as Where(keep, scores, lowest) on the scores (masked_fill, as older BLOOM
// code wrote it) instead of adding Where(keep, 0, lowest).
TEST_F(OnnxLiftVariants, MaskAsWhereOnTheScores) {
  ::onnx::ModelProto m = load("bloom.onnx");
  auto* g = m.mutable_graph();
  std::map<std::string, const ::onnx::NodeProto*> where_of;  // output -> Where node
  const auto nodes = g->node();
  for (const ::onnx::NodeProto& n : nodes)
    if (n.op_type() == "Where") where_of[n.output(0)] = &n;
  g->clear_node();
  int replaced = 0;
  for (const ::onnx::NodeProto& n : nodes) {
    const auto it = n.op_type() == "Add" ? where_of.find(n.input(1)) : where_of.end();
    if (it == where_of.end() || n.name().find("self_attention") == std::string::npos) {
      *g->add_node() = n;
      continue;
    }
    const ::onnx::NodeProto& mask = *it->second;  // Where(keep, 0, lowest)
    onnx_test::add_node(g, "Where", n.name() + "/as_where",
                        {mask.input(0), n.input(0), mask.input(2)}, {n.output(0)});
    ++replaced;
  }
  ASSERT_EQ(replaced, 2) << "one masked addition per layer";
  const std::string path = onnx_test::write_model(m, onnx_test::test_dir() + "/bloom.onnx");
  CompiledModel engine(ctx_,
                       build_model_from_onnx({path}, kBloomTokenizer, BuildOptions{}, ctx_.log()));
  check_bloom_plan(engine, ImportGraph::build(read_onnx_model(path)),
                   "bloom with the mask as Where (onnxruntime: the same function)", true);
}

// The T5 export with T5 v1.0's FFN: wo(relu(wi x)) instead of wo(gelu(wi_0 x) * wi_1 x).
std::string t5_with_relu_ffn(const std::string& file, const std::string& dir, int* replaced) {
  ::onnx::ModelProto m = load(file);
  auto* g = m.mutable_graph();
  const auto nodes = g->node();
  g->clear_node();
  for (const ::onnx::NodeProto& n : nodes) {
    const std::string& name = n.name();
    const size_t at = name.find("/DenseReluDense/");
    if (at == std::string::npos) {
      *g->add_node() = n;
      continue;
    }
    const std::string prefix = name.substr(0, at) + "/DenseReluDense/";
    const std::string rest = name.substr(prefix.size());
    if (rest.starts_with("act/") || rest.starts_with("wi_1/") || rest == "Mul") continue;
    ::onnx::NodeProto copy = n;
    if (rest.starts_with("wo/") && n.op_type() == "MatMul") copy.set_input(0, prefix + "relu");
    *g->add_node() = copy;
    if (rest.starts_with("wi_0/") && n.op_type() == "MatMul") {
      onnx_test::add_node(g, "Relu", prefix + "relu", {n.output(0)}, {prefix + "relu"});
      ++*replaced;
    }
  }
  return onnx_test::write_model(m, dir + "/" + file);
}

TEST_F(OnnxLiftVariants, T5ReluFeedForward) {
  const std::string dir = onnx_test::test_dir();
  int replaced = 0;
  const std::string enc_path = t5_with_relu_ffn("t5_encoder.onnx", dir, &replaced);
  const std::string dec_path = t5_with_relu_ffn("t5_decoder.onnx", dir, &replaced);
  ASSERT_EQ(replaced, 4) << "two FFNs in each stack";
  const ModelIR model =
      build_model_from_onnx({enc_path, dec_path}, kT5Tokenizer, BuildOptions{}, ctx_.log());
  const nlohmann::json cfg = nlohmann::json::parse(model.source_config_json);
  EXPECT_EQ(cfg.at("feed_forward_proj"), "relu") << model.source_config_json;
  CompiledModel engine(ctx_, model);
  const ImportGraph enc = ImportGraph::build(read_onnx_model(enc_path));
  const ImportGraph dec = ImportGraph::build(read_onnx_model(dec_path));
  const Tensor& ids = fx("t5_encoder.in.input_ids");
  const Tensor& mask = fx("t5_encoder.in.attention_mask");
  const Tensor& dec_ids = fx("t5_decoder.in.input_ids");
  const ImportTensor states =
      run_import_graph(enc,
                       {{"input_ids", ImportTensor::from_tensor(OnnxElemType::kInt64, ids)},
                        {"attention_mask", ImportTensor::from_tensor(OnnxElemType::kInt64, mask)}})
          .at("last_hidden_state");
  const std::vector<float> logits =
      run_import_graph(
          dec, {{"input_ids", ImportTensor::from_tensor(OnnxElemType::kInt64, dec_ids)},
                {"encoder_hidden_states", states},
                {"encoder_attention_mask", ImportTensor::from_tensor(OnnxElemType::kInt64, mask)}})
          .at("logits")
          .to_floats();
  const int64_t s = ids.dim(1), t = dec_ids.dim(1);
  std::vector<int64_t> all(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) all[i] = i;
  Error_ h, l;
  for (int64_t r = 0; r < ids.dim(0); ++r) {
    const std::vector<int64_t> row(dec_ids.data<int64_t>() + r * t,
                                   dec_ids.data<int64_t>() + (r + 1) * t);
    const Forward f = run_forward(engine, real_tokens(ids, mask, r), row, false);
    accumulate(h, states.to_floats(), s, states.dim(2), r, positions_of(mask, r), f.encoder_hidden);
    accumulate(l, logits, t, engine.desc().vocab_size, r, all, f.logits);
  }
  report("t5 with a relu FFN, encoder states, plan vs interpreter", h);
  report("t5 with a relu FFN, logits, plan vs interpreter", l);
}

}  // namespace
}  // namespace kiln
