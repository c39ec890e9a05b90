// Graph passes on the real fixture models (and small hand-built graphs): the optimized engine
// computes what the unoptimized one does, each fusion fires where it should, constant folding
// widens fp16 weights, dead code goes, and the memory plan never lets two live values share a
// buffer.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "../models/graph_runner.h"
#include "../models/model_runner.h"
#include "../models/parity_util.h"
#include "../ops/f16_reference.h"
#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "frontend/hf/frontend.h"
#include "graph/builder.h"
#include "graph/linear.h"
#include "graph/verifier.h"
#include "graph/workspace.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

const Logger kQuiet(LogLevel::kSilent);

ModelIR build(const std::string& dir, bool optimize) {
  BuildOptions options;
  options.optimize = optimize;
  return build_model(fixture(dir), options, kQuiet);
}

int count_ops(const Graph& g, OpKind op) {
  int n = 0;
  for (const Node& node : g.nodes) n += node.op == op;
  return n;
}

// The op of the node producing value `id`, or nullopt for inputs and weights.
std::optional<OpKind> producer_op(const Graph& g, int id) {
  const int p = g.values[id].producer;
  if (g.values[id].kind != ValueKind::kActivation || p < 0) return std::nullopt;
  return g.nodes[p].op;
}

struct ForwardCase {
  std::vector<int64_t> prompt;   // T5 encoder input (ignored for BLOOM)
  std::vector<int64_t> decoder;  // T5 decoder ids / BLOOM sequence
};

class PassesOnModels : public testing::TestWithParam<std::string> {
 protected:
  bool t5() const { return GetParam() == "t5-tiny"; }
  std::vector<ForwardCase> cases() const {
    if (t5())
      return {{{5, 17, 42, 1}, {0, 12, 33, 7}},
              {{100, 3, 250, 7, 9, 60, 1}, {0}},
              {{287, 1}, {0, 4, 4, 4, 200}}};
    return {{{}, {1, 50, 200, 7, 400, 13}}, {{}, {2, 99}}, {{}, {447}}};
  }
  Context ctx_{ContextOptions{LogLevel::kWarning, 2}};
};

TEST_P(PassesOnModels, OptimizedMatchesUnoptimizedLogits) {
  ModelIR plain_ir = build(GetParam(), false), opt_ir = build(GetParam(), true);
  for (size_t i = 0; i < plain_ir.graphs.size(); ++i)
    EXPECT_LT(opt_ir.graphs[i].nodes.size(), plain_ir.graphs[i].nodes.size())
        << plain_ir.graphs[i].name << ": the pipeline should fuse something";
  CompiledModel plain(ctx_, std::move(plain_ir)), optimized(ctx_, std::move(opt_ir));
  for (const ForwardCase& c : cases()) {
    for (bool step : {false, true}) {
      const Forward a = run_forward(plain, c.prompt, c.decoder, step);
      const Forward b = run_forward(optimized, c.prompt, c.decoder, step);
      EXPECT_LE(relative_error(b.logits, a.logits), 1e-5)
          << c.decoder.size() << " tokens" << (step ? ", one per step" : "");
      if (t5()) {
        EXPECT_LE(relative_error(b.encoder_hidden, a.encoder_hidden), 1e-5);
      }
    }
  }
}

// Every activation value that is pooled has a slot; inputs, weights and outputs have none
// (except a CPU encoder's streamed outputs, pooled like the others); and two values sharing a
// slot never live at the same time (a node's inputs and outputs included).
void check_memory_plan(const Graph& g) {
  SCOPED_TRACE(g.name);
  const int nv = static_cast<int>(g.values.size());
  ASSERT_EQ(static_cast<int>(g.value_slot.size()), nv) << "plan_memory did not run";
  std::vector<bool> is_output(nv, false);
  for (int id : g.outputs) is_output[id] = true;
  std::vector<int> def(nv, -1), last(nv, -1);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    for (int id : g.nodes[n].outputs) def[id] = static_cast<int>(n);
    for (int id : g.nodes[n].inputs)
      if (id >= 0) last[id] = static_cast<int>(n);
  }
  std::vector<std::vector<int>> members(static_cast<size_t>(g.num_slots));
  for (int id = 0; id < nv; ++id) {
    const Value& v = g.values[id];
    const int slot = g.value_slot[id];
    if (v.kind != ValueKind::kActivation || (is_output[id] && slot == -1)) {
      EXPECT_EQ(slot, -1) << v.name << " is an input, weight or graph output";
      continue;
    }
    if (is_output[id]) {
      EXPECT_EQ(g.name, kEncoderGraph) << v.name << ": only encoders stream";
    }
    ASSERT_GE(slot, 0) << v.name;
    ASSERT_LT(slot, g.num_slots) << v.name;
    ASSERT_GE(def[id], 0) << v.name << " has no producer";
    last[id] = std::max(last[id], def[id]);
    members[slot].push_back(id);
  }
  for (size_t s = 0; s < members.size(); ++s)
    for (size_t i = 0; i < members[s].size(); ++i)
      for (size_t j = i + 1; j < members[s].size(); ++j) {
        const int a = members[s][i], b = members[s][j];
        EXPECT_TRUE(last[a] < def[b] || last[b] < def[a])
            << "slot " << s << ": '" << g.values[a].name << "' lives [" << def[a] << ", " << last[a]
            << "] and '" << g.values[b].name << "' [" << def[b] << ", " << last[b] << "]";
      }
  const WorkspaceLayout r = workspace_layout(g, {{"tokens", 128}, {"rows", 1}});
  EXPECT_LT(r.bytes, r.unplanned_bytes);
  EXPECT_GT(r.bytes, 0);
}

TEST_P(PassesOnModels, MemoryPlanNeverSharesASlotBetweenLiveValues) {
  for (const Graph& g : build(GetParam(), true).graphs) {
    check_memory_plan(g);
    // CPU plans: the encoder streams every output (its cross K/V projections share buffers),
    // the decoder none (the runtime reads the logits after the step).
    for (size_t o = 0; o < g.outputs.size(); ++o)
      EXPECT_EQ(g.streams_output(o), g.name == kEncoderGraph) << g.name << " output " << o;
  }
  // The unfused graphs too (more nodes, different lifetimes).
  for (Graph& g : build(GetParam(), false).graphs) {
    plan_memory(g, kQuiet, {{"tokens", 128}, {"rows", 1}});
    check_memory_plan(g);
  }
}

INSTANTIATE_TEST_SUITE_P(Passes, PassesOnModels, testing::Values("t5-tiny", "bloom-tiny"),
                         [](const auto& info) {
                           return info.param == "t5-tiny" ? std::string("T5") : "Bloom";
                         });

// CPU plans stack each T5 self attention's q, k and v into one Linear feeding a packed_qkv
// Attention (cross attention keeps its own q: its k and v come from the encoder). Every output
// is the same dot product of the same weight row, so on the avx512 panel kernel the logits are
// bit-identical to the unfused graph's; a projection read elsewhere is left alone.
TEST(Passes, FuseQkvStacksT5SelfAttentionExactly) {
  ModelIR plain_ir = build("t5-tiny", false);
  ModelIR fused_ir = build("t5-tiny", false);
  for (size_t i = 0; i < fused_ir.graphs.size(); ++i) {
    Graph& g = fused_ir.graphs[i];
    int self = 0;
    for (const Node& n : g.nodes)
      self += n.op == OpKind::kAttention && n.attr<AttentionAttrs>().kind != AttentionKind::kCross;
    ASSERT_GT(self, 0) << g.name;
    const int linears = count_ops(g, OpKind::kLinear);
    EXPECT_EQ(fuse_qkv(g, kQuiet), self) << g.name;
    EXPECT_EQ(count_ops(g, OpKind::kLinear), linears - 2 * self) << g.name;
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kAttention) continue;
      const AttentionAttrs& a = n.attr<AttentionAttrs>();
      EXPECT_EQ(a.packed_qkv, a.kind != AttentionKind::kCross) << n.name;
      if (!a.packed_qkv) continue;
      const Value& qkv = g.values[n.inputs[0]];
      EXPECT_EQ(qkv.shape.back().value, 3 * a.num_heads * a.head_dim) << n.name;
      const Node& lin = g.nodes[qkv.producer];
      EXPECT_TRUE(lin.name.ends_with(".qkv")) << lin.name;
      EXPECT_TRUE(g.values[lin.inputs[1]].name.ends_with(".qkv.weight"));
    }
    verify_graph(g);
    EXPECT_EQ(fuse_qkv(g, kQuiet), 0) << "a second run finds nothing to stack";
    const Graph& before = plain_ir.graphs[i];
    EXPECT_EQ(g.weight_bytes(), before.weight_bytes()) << "the old weights are dropped";
  }
  Context ctx{ContextOptions{LogLevel::kWarning, 2}};
  const bool exact = ctx.cpu_isa() == CpuIsa::kAvx512;
  CompiledModel plain(ctx, std::move(plain_ir)), fused(ctx, std::move(fused_ir));
  for (bool step : {false, true}) {
    const Forward a = run_forward(plain, {100, 3, 250, 7, 9, 60, 1}, {0, 12, 33, 7}, step);
    const Forward b = run_forward(fused, {100, 3, 250, 7, 9, 60, 1}, {0, 12, 33, 7}, step);
    ASSERT_EQ(a.logits.numel(), b.logits.numel());
    if (exact) {
      EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0)
          << (step ? "one token per step" : "all tokens at once");
      EXPECT_EQ(
          std::memcmp(a.encoder_hidden.raw(), b.encoder_hidden.raw(), a.encoder_hidden.nbytes()),
          0);
    } else {
      EXPECT_LE(relative_error(b.logits, a.logits), 1e-6);
    }
  }

  // A projection whose output is also read elsewhere (here: a graph output) keeps its Linear.
  ModelIR shared = build("t5-tiny", false);
  Graph& dec = shared.graph(kDecoderGraph);
  int self = 0, first_k = -1;
  for (const Node& n : dec.nodes) {
    if (n.op != OpKind::kAttention || n.attr<AttentionAttrs>().kind == AttentionKind::kCross)
      continue;
    ++self;
    if (first_k < 0) first_k = n.inputs[1];
  }
  dec.outputs.push_back(first_k);
  EXPECT_EQ(fuse_qkv(dec, kQuiet), self - 1);
  verify_graph(dec);
}

// T5's gated feed-forward: wi_0 and wi_1 become one Linear over [wi_0; wi_1] feeding a
// GatedActivation over the packed rows; on the avx512 panel kernel every output is the same
// dot product, so the logits are bit-identical to the unfused graph's.
TEST(Passes, FuseGateUpStacksT5FeedForwardExactly) {
  ModelIR plain_ir = build("t5-tiny", false);
  ModelIR fused_ir = build("t5-tiny", false);
  for (Graph& g : fused_ir.graphs) {
    const int gated = count_ops(g, OpKind::kGatedActivation);
    ASSERT_GT(gated, 0) << g.name;
    const int linears = count_ops(g, OpKind::kLinear);
    EXPECT_EQ(fuse_gate_up(g, kQuiet), gated) << g.name;
    EXPECT_EQ(count_ops(g, OpKind::kLinear), linears - gated) << g.name;
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kGatedActivation) continue;
      EXPECT_EQ(n.inputs.size(), 1u) << n.name;
      const Node& lin = g.nodes[g.values[n.inputs[0]].producer];
      EXPECT_TRUE(lin.name.ends_with(".wi")) << lin.name;
    }
    verify_graph(g);
    EXPECT_EQ(fuse_gate_up(g, kQuiet), 0) << "a second run finds nothing to stack";
  }
  Context ctx{ContextOptions{LogLevel::kWarning, 2}};
  const bool exact = ctx.cpu_isa() == CpuIsa::kAvx512;
  CompiledModel plain(ctx, std::move(plain_ir)), fused(ctx, std::move(fused_ir));
  const Forward a = run_forward(plain, {100, 3, 250, 7, 9, 60, 1}, {0, 12, 33, 7}, true);
  const Forward b = run_forward(fused, {100, 3, 250, 7, 9, 60, 1}, {0, 12, 33, 7}, true);
  ASSERT_EQ(a.logits.numel(), b.logits.numel());
  if (exact)
    EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0);
  else
    EXPECT_LE(relative_error(b.logits, a.logits), 1e-6);
}

// CPU and CUDA plans get fuse_qkv from the pipeline: every T5 self attention reads a packed
// q/k/v.
TEST(Passes, FuseQkvRunsOnCpuAndCudaPlans) {
  auto packed = [](Device device) {
    BuildOptions o;
    o.device = device;
    const ModelIR m = build_model(fixture("t5-tiny"), o, kQuiet);
    int n = 0;
    for (const Graph& g : m.graphs)
      for (const Node& node : g.nodes)
        n += node.op == OpKind::kAttention && node.attr<AttentionAttrs>().packed_qkv;
    return n;
  };
  EXPECT_GT(packed(Device::kCpu), 0);
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  EXPECT_EQ(packed(Device::kCuda), packed(Device::kCpu));
}

TEST(Passes, FuseLinearActivationFiresOnBloom) {
  ModelIR plain = build("bloom-tiny", false);
  Graph& g = plain.graph(kDecoderGraph);
  const int layers = plain.desc.cache_layers;
  ASSERT_EQ(count_ops(g, OpKind::kActivation), layers);
  EXPECT_EQ(fuse_linear_activation(g, kQuiet), layers);
  verify_graph(g);

  const ModelIR optimized = build("bloom-tiny", true);
  const Graph& o = optimized.graph(kDecoderGraph);
  EXPECT_EQ(count_ops(o, OpKind::kActivation), 0);
  int fused = 0;
  for (const Node& n : o.nodes) {
    if (n.op != OpKind::kLinear || !n.attr<LinearAttrs>().epilogue.activation) continue;
    ++fused;
    EXPECT_EQ(n.attr<LinearAttrs>().epilogue.activation, Activation::kGeluTanh) << n.name;
    EXPECT_NE(n.name.find("dense_h_to_4h"), std::string::npos) << n.name;
  }
  EXPECT_EQ(fused, layers);
}

TEST(Passes, FuseAddRmsNormFiresOnT5) {
  ModelIR plain = build("t5-tiny", false);
  for (Graph& g : plain.graphs) {
    int pairs = 0;  // RMSNorms reading a residual Add, before fusion
    for (const Node& n : g.nodes)
      pairs += n.op == OpKind::kRmsNorm && producer_op(g, n.inputs[0]) == OpKind::kAdd;
    EXPECT_GT(pairs, 0) << g.name;
    EXPECT_EQ(fuse_add_rms_norm(g, kQuiet), pairs) << g.name;
    EXPECT_EQ(count_ops(g, OpKind::kAddRmsNorm), pairs) << g.name;
    verify_graph(g);
  }
  const ModelIR optimized = build("t5-tiny", true);
  const int layers = optimized.desc.cache_layers;  // t5-tiny: as many decoder as encoder layers
  for (const Graph& g : optimized.graphs) {
    EXPECT_GE(count_ops(g, OpKind::kAddRmsNorm), layers) << g.name;
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kRmsNorm) continue;
      EXPECT_NE(producer_op(g, n.inputs[0]), OpKind::kAdd) << n.name << " still reads an Add";
    }
  }
}

// CUDA plans of BLOOM fold both residual adds of every layer into the Linear before them; T5's
// adds are already fused with their norms (AddRMSNorm); CPU plans keep their adds.
TEST(Passes, FuseLinearResidualFiresOnBloomCudaPlans) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  auto built = [](const char* model, Device device) {
    BuildOptions o;
    o.device = device;
    return build_model(fixture(model), o, kQuiet);
  };
  const ModelIR bloom = built("bloom-tiny", Device::kCuda);
  const Graph& dec = bloom.graph(kDecoderGraph);
  int fused = 0;
  for (const Node& n : dec.nodes)
    fused += n.op == OpKind::kLinear && linear_operand(n, LinearOperand::kResidual) >= 0;
  EXPECT_EQ(fused, 2 * bloom.desc.cache_layers);
  EXPECT_EQ(count_ops(dec, OpKind::kAdd), 0);
  EXPECT_GT(count_ops(built("bloom-tiny", Device::kCpu).graph(kDecoderGraph), OpKind::kAdd), 0);
}

// CUDA plans of BLOOM fold the two LayerNorms of every layer into the Linear reading each
// (query_key_value, dense_h_to_4h), and ln_f into the lm_head, which shares its weight with the
// embedding and so takes gamma as its norm scale; the embeddings' LayerNorm (its output is the
// residual stream) stays a node, which gathers the embedding rows itself (fuse_embedding_norm);
// the lm_head reads the rows that need logits itself (fuse_gather_linear).
// Every folded Linear carries its weight's f32 row sums; CPU plans fold nothing.
TEST(Passes, FuseNormLinearFiresOnBloomCudaPlans) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  auto built = [](Device device) {
    BuildOptions o;
    o.device = device;
    return build_model(fixture("bloom-tiny"), o, kQuiet);
  };
  const ModelIR cpu = built(Device::kCpu);
  const int norms = count_ops(cpu.graph(kDecoderGraph), OpKind::kLayerNorm);
  const ModelIR bloom = built(Device::kCuda);
  const Graph& dec = bloom.graph(kDecoderGraph);
  int fused = 0, scaled = 0;
  for (const Node& n : dec.nodes) {
    if (n.op != OpKind::kLinear || !n.attr<LinearAttrs>().epilogue.norm) continue;
    ++fused;
    EXPECT_EQ(*n.attr<LinearAttrs>().epilogue.norm, InputNorm::kLayerNorm) << n.name;
    const int sums = linear_operand(n, LinearOperand::kNormRowSums);
    ASSERT_GE(sums, 0) << n.name;
    EXPECT_EQ(dec.values[sums].dtype, DType::kF32) << n.name;
    if (const int scale = linear_operand(n, LinearOperand::kNormScale); scale >= 0) {
      ++scaled;
      EXPECT_EQ(dec.values[scale].dtype, DType::kF32) << n.name;
    }
  }
  EXPECT_EQ(fused, 2 * bloom.desc.cache_layers + 1);
  EXPECT_EQ(scaled, 1);  // the tied lm_head
  EXPECT_EQ(count_ops(dec, OpKind::kLayerNorm), norms - fused);
  EXPECT_EQ(count_ops(dec, OpKind::kLayerNorm), 1);  // the embeddings' norm, gathering
  EXPECT_EQ(count_ops(dec, OpKind::kEmbedding), 0);
  EXPECT_EQ(count_ops(dec, OpKind::kGatherRows), 0);  // the lm_head reads its rows itself
  for (const Node& n : cpu.graph(kDecoderGraph).nodes) {
    if (n.op == OpKind::kLinear) {
      EXPECT_FALSE(n.attr<LinearAttrs>().epilogue.norm) << n.name;
    }
  }
}

// A norm whose folded weight would overflow the weight's type (an fp16 weight times a gamma of
// 1e5) stays a node, and the graph is untouched; the same norm with gamma 1 folds, and its
// folded weight, bias and row sums hold w * gamma, bias + w · beta and the row sums.
TEST(Passes, FuseNormLinearKeepsANormWhoseFoldedWeightsOverflow) {
  for (const float gamma : {1e5f, 1.0f}) {
    GraphBuilder b("norm_linear");
    const int x = b.input("x", DType::kF16, {Dim::sym("tokens"), Dim::of(4)});
    const auto f16 = [](std::vector<float> v, Shape shape) {
      return Tensor::from_vector(v, std::move(shape)).to(DType::kF16);
    };
    const int y = b.layer_norm(x, b.weight("g", f16(std::vector<float>(4, gamma), {4})),
                               b.weight("beta", f16({1, 0, 0, 0}, {4})), 1e-5, "ln");
    b.output(b.linear(y, b.weight("w", f16({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4})),
                      b.weight("b", f16({0.5f, 0.25f}, {2})), "fc"),
             "out");
    Graph g = b.finish();
    const size_t nodes = g.nodes.size();
    const int folded = fuse_norm_linear(g, kQuiet);
    verify_graph(g);
    if (gamma > 1.0f) {
      EXPECT_EQ(folded, 0);
      EXPECT_EQ(g.nodes.size(), nodes);
      continue;
    }
    ASSERT_EQ(folded, 1);
    ASSERT_EQ(g.nodes.size(), 1u);
    const Node& fc = g.nodes[0];
    EXPECT_EQ(fc.inputs[0], g.inputs[0]);
    const Tensor w = g.values[fc.inputs[1]].data.to_f32(),
                 bias = g.values[fc.inputs[2]].data.to_f32(),
                 sums = g.values[linear_operand(fc, LinearOperand::kNormRowSums)].data;
    EXPECT_EQ(w.data<float>()[5], 6.0f);
    EXPECT_EQ(bias.data<float>()[0], 1.5f);  // 0.5 + w[0][0] * beta[0]
    EXPECT_EQ(bias.data<float>()[1], 5.25f);
    EXPECT_EQ(sums.data<float>()[0], 10.0f);
    EXPECT_EQ(sums.data<float>()[1], 26.0f);
  }
}

// CUDA fp16 plans of T5 keep the residual stream in f32 (issue 9: fp16 T5 overflows): the
// wo Linears compute in f32 with f32 weights, norms and residual adds read and write f32, every
// other Linear stays fp16, casts join them, and the graph still verifies. bf16 and BLOOM
// (LayerNorm) narrow everything.
TEST(Passes, NarrowGraphKeepsT5ResidualStreamF32InFp16) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  auto narrowed = [](const char* model, Precision precision) {
    BuildOptions o;
    o.device = Device::kCuda;
    o.precision = precision;
    return build_model(fixture(model), o, kQuiet);
  };
  const ModelIR t5 = narrowed("t5-tiny", Precision::kFp16);
  for (const Graph& g : t5.graphs) {
    int wo = 0, narrow_linears = 0, casts = 0, widened = 0;
    for (const Node& n : g.nodes) {
      const DType out = g.values[n.outputs[0]].dtype;
      if (n.op == OpKind::kLinear) {
        const std::string& w = g.values[n.inputs[1]].name;
        const bool is_wo = w.find(".wo.") != std::string::npos;
        // The lm_head stores the f32 logits itself (fuse_linear_cast): computed in fp16.
        const bool widen = n.attr<LinearAttrs>().epilogue.widen;
        wo += is_wo;
        widened += widen;
        narrow_linears += !is_wo;
        EXPECT_EQ(out, is_wo || widen ? DType::kF32 : DType::kF16) << n.name;
        const DType computed = widen ? DType::kF16 : out;
        EXPECT_EQ(g.values[n.inputs[1]].dtype, computed) << n.name << " weight";
        EXPECT_EQ(g.values[n.inputs[0]].dtype, computed) << n.name << " input";
      }
      if (n.op == OpKind::kAddRmsNorm || n.op == OpKind::kRmsNorm) {
        for (int o : n.outputs) {
          EXPECT_EQ(g.values[o].dtype, DType::kF32) << n.name;
        }
        EXPECT_EQ(g.values[n.inputs[0]].dtype, DType::kF32) << n.name;
      }
      casts += n.op == OpKind::kCast;
    }
    EXPECT_GT(narrow_linears, 0) << g.name;
    EXPECT_GT(casts, 0) << g.name;
    if (g.name == kDecoderGraph || g.name == kEncoderGraph) {
      EXPECT_GT(wo, 0) << g.name;
    }
    // The lm_head, and the fp16 Linears whose output joins the f32 residual stream.
    EXPECT_GT(widened, g.name == kDecoderGraph ? 1 : 0) << g.name;
    verify_graph(g);
  }
  for (const ModelIR& m :
       {narrowed("t5-tiny", Precision::kBf16), narrowed("bloom-tiny", Precision::kFp16)}) {
    for (const Graph& g : m.graphs) {
      for (const Value& v : g.values) {
        // The folded norms' row sums and scales (fuse_norm_linear) are f32 by design.
        if (v.kind != ValueKind::kInput && v.name != "logits" &&
            !v.name.ends_with(".norm_row_sums") && !v.name.ends_with(".norm_scale")) {
          EXPECT_NE(v.dtype, DType::kF32) << m.desc.architecture << " " << v.name;
        }
      }
    }
  }
}

// A norm weight computed by a node (a Cast of an fp16 weight, as the BLOOM frontend makes, left
// unfolded when fold_constants is off) that the builder placed after the residual Add.
TEST(Passes, FuseAddRmsNormKeepsTopologicalOrderWhenTheNormWeightIsComputed) {
  GraphBuilder b("g");
  const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(8)});
  const int y = b.input("y", DType::kF32, {Dim::sym("tokens"), Dim::of(8)});
  const int sum = b.add(x, y, "residual");
  Tensor w16 = Tensor::empty(DType::kF32, {8}).to(DType::kF16);
  const int w = b.cast(b.weight("norm.w16", w16), DType::kF32, "norm.w");
  b.output(b.rms_norm(sum, w, 1e-6, "norm"), "normed");
  b.output(sum, "sum");
  Graph g = b.finish();
  // The fused node would take the Add's place, before the Cast that makes its weight: the pass
  // must leave this pair alone (and the graph valid).
  EXPECT_EQ(fuse_add_rms_norm(g, kQuiet), 0);
  EXPECT_EQ(count_ops(g, OpKind::kRmsNorm), 1);
  EXPECT_NO_THROW(verify_graph(g)) << dump_graph(g);

  // The same graph with the Cast made before the Add fuses.
  GraphBuilder c("g2");
  const int cx = c.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(8)});
  const int cy = c.input("y", DType::kF32, {Dim::sym("tokens"), Dim::of(8)});
  const int cw = c.cast(c.weight("norm.w16", w16), DType::kF32, "norm.w");
  const int csum = c.add(cx, cy, "residual");
  c.output(c.rms_norm(csum, cw, 1e-6, "norm"), "normed");
  c.output(csum, "sum");
  Graph g2 = c.finish();
  EXPECT_EQ(fuse_add_rms_norm(g2, kQuiet), 1);
  EXPECT_EQ(count_ops(g2, OpKind::kAddRmsNorm), 1);
  EXPECT_EQ(count_ops(g2, OpKind::kRmsNorm), 0);
  EXPECT_NO_THROW(verify_graph(g2)) << dump_graph(g2);
}

TEST(Passes, FoldConstantsWidensBloomFp16Weights) {
  ModelIR raw = import_hf_model(fixture("bloom-tiny"), kQuiet);
  Graph& g = raw.graph(kDecoderGraph);
  // Every Cast reads an fp16 weight; remember each source by the Cast's output name.
  std::map<std::string, Tensor> sources;
  for (const Node& n : g.nodes) {
    if (n.op != OpKind::kCast) continue;
    const Value& in = g.values[n.inputs[0]];
    ASSERT_EQ(in.kind, ValueKind::kWeight) << n.name;
    ASSERT_EQ(in.dtype, DType::kF16) << n.name;
    sources[g.values[n.outputs[0]].name] = in.data;
  }
  ASSERT_GT(sources.size(), 10u);
  EXPECT_EQ(fold_constants(g, kQuiet), static_cast<int>(sources.size()));
  EXPECT_EQ(count_ops(g, OpKind::kCast), 0);
  verify_graph(g);
  for (const Node& n : g.nodes) {
    for (int id : n.inputs) {
      if (id >= 0 && g.values[id].kind == ValueKind::kWeight) {
        EXPECT_EQ(g.values[id].dtype, DType::kF32) << n.name << " reads " << g.values[id].name;
      }
    }
  }
  for (const auto& [name, src] : sources) {
    const Value& v = g.values[g.find_value(name)];
    ASSERT_EQ(v.kind, ValueKind::kWeight) << name;
    ASSERT_EQ(v.data.dtype(), DType::kF32) << name;
    ASSERT_EQ(v.data.shape(), src.shape()) << name;
    const auto* half = static_cast<const uint16_t*>(src.raw());
    for (int64_t i = 0; i < src.numel(); ++i)
      ASSERT_EQ(static_cast<double>(v.data.data<float>()[i]), f16_value(half[i])) << name << i;
  }
  eliminate_dead(g, kQuiet);
  verify_graph(g);
  for (const Value& v : g.values)
    if (v.kind == ValueKind::kWeight) {
      EXPECT_EQ(v.dtype, DType::kF32) << v.name;
    }
  // The whole pipeline leaves the same: no casts, f32 weights only.
  const ModelIR optimized = build("bloom-tiny", true);
  EXPECT_EQ(count_ops(optimized.graph(kDecoderGraph), OpKind::kCast), 0);
  for (const Value& v : optimized.graph(kDecoderGraph).values)
    if (v.kind == ValueKind::kWeight) {
      EXPECT_EQ(v.dtype, DType::kF32) << v.name;
    }
}

TEST(Passes, FoldConstantsEvaluatesScaleAddMulOfWeights) {
  GraphBuilder b("g");
  const std::vector<float> w = {1.5f, -2.0f, 0.25f, 3.0f};
  const int wi = b.weight("w", Tensor::from_vector(w, {4}));
  const int folded = b.add(b.scale(wi, 0.5f, "half"), b.mul(wi, wi, "square"), "const_sum");
  const int x = b.input("x", DType::kF32, {Dim::of(4)});
  b.output(b.add(x, folded, "out"), "y");
  Graph g = b.finish();
  EXPECT_EQ(fold_constants(g, kQuiet), 3);
  ASSERT_EQ(g.nodes.size(), 1u);
  const Value& c = g.values[g.find_value("const_sum")];
  ASSERT_EQ(c.kind, ValueKind::kWeight);
  for (size_t i = 0; i < w.size(); ++i)
    EXPECT_EQ(c.data.data<float>()[i], static_cast<float>(w[i] * 0.5 + double{w[i]} * w[i]));
  verify_graph(g);
}

TEST(Passes, FoldConstantsLeavesNodesNobodyReads) {
  // A Cast of a weight that a reader no longer takes (keep_narrow_weights rewired it) is not
  // evaluated: eliminate_dead drops it; the Cast that is read folds.
  GraphBuilder b("g");
  const std::vector<float> w = {1.5f, -2.0f, 0.25f, 3.0f};
  const int wi = b.weight("w", Tensor::from_vector(w, {4}).to(DType::kF16));
  b.cast(wi, DType::kF32, "unread.cast");
  const int read = b.cast(wi, DType::kF32, "read.cast");
  const int x = b.input("x", DType::kF32, {Dim::of(4)});
  b.output(b.add(x, read, "out"), "y");
  Graph g = b.finish();
  EXPECT_EQ(fold_constants(g, kQuiet), 1);
  EXPECT_EQ(count_ops(g, OpKind::kCast), 1);
  ASSERT_EQ(g.values[g.find_value("read.cast")].kind, ValueKind::kWeight);
  EXPECT_EQ(g.values[g.find_value("read.cast")].data.data<float>()[3], 3.0f);
  EXPECT_GT(eliminate_dead(g, kQuiet), 0);
  EXPECT_EQ(count_ops(g, OpKind::kCast), 0);
  verify_graph(g);
}

TEST(Passes, EliminateDeadRemovesDanglingNodesAndUnusedWeights) {
  GraphBuilder b("g");
  const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(4)});
  b.input("spare", DType::kI64, {Dim::sym("rows")});  // part of the contract though unread
  const std::vector<float> wv = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  b.output(b.linear(x, b.weight("w", Tensor::from_vector(wv, {3, 4})), -1, "fc"), "y");
  const int dead_w = b.weight("dead.w", Tensor::from_vector(wv, {3, 4}));
  const int d1 = b.linear(x, dead_w, -1, "dead.fc");
  b.scale(d1, 2.0f, "dead.scale");  // a chain nobody reads
  b.weight("unused", Tensor::from_vector(std::vector<float>{1, 2}, {2}));
  Graph g = b.finish();
  const std::vector<float> xv = {0.5f, -1, 2, 0.25f, 1, 1, 1, 1};
  Context ctx(ContextOptions{LogLevel::kWarning, 1});
  const std::map<std::string, Tensor> feed = {
      {"x", Tensor::from_vector(xv, {2, 4})},
      {"spare", Tensor::from_vector(std::vector<int64_t>{0}, {1})}};
  const Tensor before = run_graph(*make_cpu_backend(ctx), g, feed).at("y");

  EXPECT_GT(eliminate_dead(g, kQuiet), 0);
  verify_graph(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].name, "fc");
  for (const char* gone : {"dead.w", "dead.fc", "dead.scale", "unused"})
    EXPECT_EQ(g.find_value(gone), -1) << gone;
  EXPECT_GE(g.find_value("w"), 0);
  EXPECT_EQ(g.inputs.size(), 2u) << "graph inputs stay";
  EXPECT_EQ(g.values[g.output("y")].producer, 0);
  const Tensor after = run_graph(*make_cpu_backend(ctx), g, feed).at("y");
  ASSERT_EQ(after.shape(), before.shape());
  EXPECT_EQ(std::memcmp(after.raw(), before.raw(), before.nbytes()), 0);
  EXPECT_EQ(eliminate_dead(g, kQuiet), 0) << "a second run finds nothing";
}

TEST(Passes, PlanMemoryOnAChainReusesSlots) {
  GraphBuilder b("chain");
  int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(64)});
  for (int i = 0; i < 8; ++i) x = b.scale(x, 1.0f + static_cast<float>(i), "s" + std::to_string(i));
  b.output(x, "y");
  Graph g = b.finish();
  plan_memory(g, kQuiet, {{"tokens", 128}});
  check_memory_plan(g);
  EXPECT_LE(g.num_slots, 2) << "a chain needs two alternating buffers";
}

}  // namespace
}  // namespace kiln::test
