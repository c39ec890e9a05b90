// The precision plan (passes/pass.h: assign_precision, core/target.h: precision_support): one
// table says which device runs which precision how, and the CLI's refusals, the loader and the
// pass all follow it; the pass keeps T5's fp16 residual stream and FFN output projections in f32
// by where they sit (not by their weights' names) and says why per node; a build's list of
// layers to keep in float reaches both devices, and a CPU plan with every layer kept in float
// computes the fp32 plan's numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "backend/backend.h"
#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "builder/calibration_runner.h"
#include "graph/builder.h"
#include "graph/linear.h"
#include "graph/verifier.h"
#include "model_runner.h"
#include "parity_util.h"
#include "passes/pass.h"
#include "passes/precision_plan.h"

namespace kiln::test {
namespace {

const Logger kQuiet(LogLevel::kSilent);

TEST(PrecisionSupportTable, CoversEveryPairAndDecidesTheRefusals) {
  for (Device d : kAllDevices) {
    std::string names;
    for (Precision p : kAllPrecisions) {
      const PrecisionSupport& s = precision_support(d, p);
      EXPECT_EQ(s.device, d);
      EXPECT_EQ(s.precision, p);
      EXPECT_EQ(s.supported, s.unsupported.empty()) << precision_name(p);
      // fp32 is f32 everywhere; a narrow precision narrows at least the matrices.
      if (p == Precision::kFp32) {
        EXPECT_EQ(s.matrix, DType::kF32);
        EXPECT_EQ(s.activation, DType::kF32);
      } else {
        EXPECT_NE(s.matrix, DType::kF32) << precision_name(p);
      }
      // Quantized matrices carry scales (per channel for i8 and f8_e4m3, per group for i4).
      EXPECT_EQ(s.channel_scales,
                s.matrix == DType::kI8 || s.matrix == DType::kI4 || s.matrix == DType::kF8E4M3)
          << precision_name(p);
      if (s.supported) names += (names.empty() ? "" : ", ") + std::string(precision_name(p));
      // The builder's and the CLI's refusal is the table's (where the device is built in).
      if (d == Device::kCpu || query_cuda().compiled) {
        const std::string why = target_unsupported_reason(d, p);
        EXPECT_EQ(why.empty(), s.supported) << device_name(d) << " " << precision_name(p);
        if (!s.supported) {
          EXPECT_NE(why.find(std::string(s.unsupported)), std::string::npos) << why;
        }
      }
    }
    EXPECT_EQ(supported_precision_names(d), names);
  }
  EXPECT_EQ(supported_precision_names(Device::kCpu),
            "fp32, fp16, bf16, int8, int8-weight, int4-weight");
  EXPECT_EQ(supported_precision_names(Device::kCuda),
            "fp32, fp16, bf16, int8, int8-weight, int4-weight, fp8");
  // A second GPU runs what the first runs: the table is by device kind, not ordinal.
  const PrecisionSupport& second = precision_support(Device(Device::kCuda, 1), Precision::kFp16);
  EXPECT_EQ(second.device, Device::kCuda);
  EXPECT_TRUE(second.supported);
  EXPECT_EQ(second.activation, DType::kF16);
}

// Every CPU precision the table supports builds both fixtures into plans whose every node has
// a kernel on this machine's CPU backend (int8 from a calibration on a few prompts).
TEST(PrecisionSupportTable, EverySupportedCpuPrecisionHasKernelsForEveryNode) {
  Context ctx(ContextOptions{LogLevel::kError, 1});
  auto backend = make_backend(ctx, Device::kCpu);
  std::vector<CalibrationPrompt> prompts = read_calibration_prompts(fixture("data/calib.jsonl"));
  prompts.resize(8);
  for (Precision p : kAllPrecisions) {
    if (!precision_support(Device::kCpu, p).supported) continue;
    for (const char* model : {"t5-tiny", "bloom-tiny"}) {
      BuildOptions o;
      o.precision = p;
      if (precision_support(Device::kCpu, p).calibrated_inputs) {
        o.precision_options.calibration = calibrate_checkpoint(ctx, fixture(model), o, prompts, {},
                                                               parse_calibration_method("minmax"));
        o.precision_options.calibration_source = "test";
      }
      const ModelIR m = build_model(fixture(model), o, kQuiet);
      for (const Graph& g : m.graphs)
        for (const Node& n : g.nodes)
          EXPECT_EQ(backend->unsupported_reason(g, n), "")
              << model << " " << precision_name(p) << " " << n.name;
    }
  }
}

// A T5-shaped block with names that are nobody's: RMSNorm -> Linear -> ReLU -> Linear -> Add.
Graph t5_shaped_block(const char* in_name, const char* out_name) {
  GraphBuilder b("g");
  const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(4)});
  auto w = [&](const char* name, int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    return b.weight(name, Tensor::from_vector<float>(v, {rows, cols}));
  };
  const int norm =
      b.rms_norm(x, b.weight("g0", Tensor::from_vector<float>({1, 1, 1, 1}, {4})), 1e-6, "norm");
  const int h = b.activation(b.linear(norm, w(in_name, 8, 4), -1, "up"), Activation::kRelu, "act");
  const int y = b.linear(h, w(out_name, 4, 8), -1, "down");
  b.output(b.add(x, y, "residual"), "logits");
  return b.finish();
}

TEST(PrecisionPlan, Fp16KeepsTheFfnOutputProjectionWideByStructureNotByName) {
  for (const auto& [in_name, out_name] :
       {std::pair{"layer.wi.weight", "layer.wo.weight"}, std::pair{"mlp.fc_in", "mlp.fc_out"}}) {
    SCOPED_TRACE(out_name);
    Graph g = t5_shaped_block(in_name, out_name);
    std::vector<PrecisionNote> notes;
    assign_precision(g, precision_support(Device::kCuda, Precision::kFp16), {}, &notes, kQuiet);
    verify_graph(g);
    std::map<std::string, const Node*> by_name;
    for (const Node& n : g.nodes) by_name[n.name] = &n;
    ASSERT_TRUE(by_name.count("up") && by_name.count("down") && by_name.count("residual"));
    EXPECT_EQ(g.values[by_name["up"]->inputs[1]].dtype, DType::kF16);
    EXPECT_EQ(g.values[by_name["down"]->inputs[1]].dtype, DType::kF32);
    EXPECT_EQ(g.values[by_name["down"]->outputs[0]].dtype, DType::kF32);
    EXPECT_EQ(g.values[by_name["residual"]->outputs[0]].dtype, DType::kF32);
    EXPECT_EQ(g.values[by_name["norm"]->outputs[0]].dtype, DType::kF32);
    std::map<std::string, std::string> why;
    for (const PrecisionNote& n : notes) why[n.node] = n.reason;
    EXPECT_NE(why["down"].find("FFN output projection"), std::string::npos) << why["down"];
    EXPECT_NE(why["norm"].find("residual stream"), std::string::npos) << why["norm"];
    EXPECT_EQ(why.count("up"), 0u);
    // bf16 has f32's range: nothing is kept wide.
    Graph bf = t5_shaped_block(in_name, out_name);
    notes.clear();
    assign_precision(bf, precision_support(Device::kCuda, Precision::kBf16), {}, &notes, kQuiet);
    EXPECT_TRUE(notes.empty());
  }
}

// CUDA int8-weight plans (built here, run on the GPU machine): every Linear's and Embedding's
// matrix is int8 with f32 per-row scales, fp16 T5's FFN output projections included (they keep
// f32 activations for the residual stream's range, with the reason noted); norms and the other
// Linears' biases are fp16; each Embedding of an int8 table gathers f32 rows that a Cast
// narrows; the graphs verify. BLOOM's LayerNorms are folded into the Linears that read them,
// gamma as the int8 Linear's norm scale (q is left as quantized). A Linear kept in float on
// request keeps an f32 weight.
TEST(PrecisionPlan, CudaInt8WeightQuantizesEveryMatrixAndNarrowsTheRest) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  for (const char* model : {"bloom-tiny", "t5-tiny"}) {
    SCOPED_TRACE(model);
    BuildOptions o;
    o.device = Device::kCuda;
    o.precision = Precision::kInt8Weight;
    const ModelIR ir = build_model(fixture(model), o, kQuiet);
    int linears = 0, quantized = 0, f32_linears = 0, embeddings = 0, folded = 0;
    std::string first_linear;
    for (const Graph& g : ir.graphs) {
      verify_graph(g);
      for (const Node& n : g.nodes) {
        if (n.op == OpKind::kLinear) {
          ++linears;
          if (first_linear.empty()) first_linear = n.name;
          const LinearDesc d = describe_linear(n);
          const Value& w = g.values[d.operand(LinearOperand::kWeight)];
          const Value& x = g.values[d.operand(LinearOperand::kX)];
          quantized += w.dtype == DType::kI8;
          if (d.epilogue.norm) {
            ++folded;
            EXPECT_TRUE(d.has(LinearOperand::kNormScale)) << n.name;
          }
          ASSERT_TRUE(d.has(LinearOperand::kWeightScales)) << n.name;
          const Value& s = g.values[d.operand(LinearOperand::kWeightScales)];
          EXPECT_EQ(s.dtype, DType::kF32) << n.name;
          EXPECT_EQ(s.data.numel(), w.data.dim(0)) << n.name;
          if (x.dtype == DType::kF32) {
            // fp16 T5's FFN output projection: f32 activations, the reason noted.
            ++f32_linears;
            const bool noted =
                std::any_of(ir.precision_notes.begin(), ir.precision_notes.end(),
                            [&](const PrecisionNote& p) { return p.node == n.name; });
            EXPECT_TRUE(noted) << n.name;
          } else {
            EXPECT_EQ(x.dtype, DType::kF16) << n.name;
          }
          if (d.has(LinearOperand::kBias)) {
            EXPECT_EQ(g.values[d.operand(LinearOperand::kBias)].dtype, x.dtype) << n.name;
          }
        }
        if (n.op == OpKind::kEmbedding) {
          ++embeddings;
          EXPECT_EQ(g.values[n.inputs[0]].dtype, DType::kI8) << n.name;
          ASSERT_EQ(n.inputs.size(), 3u) << n.name;
          EXPECT_EQ(g.values[n.outputs[0]].dtype, DType::kF32) << n.name;
        }
        if (n.op == OpKind::kLayerNorm || n.op == OpKind::kRmsNorm) {
          EXPECT_EQ(g.values[n.inputs[1]].dtype, DType::kF16) << n.name;
        }
      }
    }
    EXPECT_GT(embeddings, 0);
    // (T5's RMSNorms join the residual adds before them, fuse_add_rms_norm, in float plans too.)
    EXPECT_EQ(folded > 0, std::string(model) == "bloom-tiny");
    EXPECT_EQ(quantized, linears);
    EXPECT_EQ(f32_linears > 0, std::string(model) == "t5-tiny");
    // A Linear kept in float on request stays f32, weight included.
    o.precision_options.keep_float = {first_linear};
    const ModelIR kept = build_model(fixture(model), o, kQuiet);
    int found = 0;
    for (const Graph& g : kept.graphs)
      for (const Node& n : g.nodes)
        if (n.name == first_linear) {
          ++found;
          EXPECT_EQ(g.values[n.inputs[1]].dtype, DType::kF32);
          EXPECT_EQ(g.values[n.inputs[0]].dtype, DType::kF32);
        }
    EXPECT_EQ(found, 1);
  }
}

// CUDA int4-weight plans (built here): every Linear's weight int4 with f16 group scales except
// the logits Linear's and the Embedding tables (int8 per row, as the CPU's int4-weight plans keep
// them, each with its reason in the plan's notes); activations fp16 as in int8-weight plans;
// BLOOM's LayerNorms folded into the int4 Linears that read them.
TEST(PrecisionPlan, CudaInt4WeightQuantizesLinearsToInt4AndKeepsTablesAndLogitsInt8) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  for (const char* model : {"bloom-tiny", "t5-tiny"}) {
    SCOPED_TRACE(model);
    BuildOptions o;
    o.device = Device::kCuda;
    o.precision = Precision::kInt4Weight;
    const ModelIR ir = build_model(fixture(model), o, kQuiet);
    int int4 = 0, int8 = 0, folded = 0;
    for (const Graph& g : ir.graphs) {
      verify_graph(g);
      for (const Node& n : g.nodes) {
        if (n.op == OpKind::kEmbedding) {
          EXPECT_EQ(g.values[n.inputs[0]].dtype, DType::kI8) << n.name;
        }
        if (n.op != OpKind::kLinear) continue;
        const LinearDesc d = describe_linear(n);
        const Value& w = g.values[d.operand(LinearOperand::kWeight)];
        const Value& s = g.values[d.operand(LinearOperand::kWeightScales)];
        if (w.dtype == DType::kI4) {
          ++int4;
          EXPECT_EQ(s.dtype, DType::kF16) << n.name;
          EXPECT_EQ(s.data.dim(1), int4_groups(w.data.dim(1))) << n.name;
          // A folded norm's gamma is the Linear's norm scale (q is left as quantized).
          if (d.epilogue.norm) {
            ++folded;
            EXPECT_TRUE(d.has(LinearOperand::kNormScale)) << n.name;
          }
        } else {
          ++int8;
          EXPECT_EQ(w.dtype, DType::kI8) << n.name;
          EXPECT_EQ(&n - g.nodes.data(), logits_linear(g)) << n.name << ": only the logits Linear";
        }
      }
    }
    EXPECT_GT(int4, 0);
    EXPECT_EQ(int8, 1);  // the logits Linear (bloom: the tied table's)
    EXPECT_EQ(folded > 0, std::string(model) == "bloom-tiny");  // T5's: AddRMSNorm nodes
  }
}

TEST(PrecisionPlan, KeepFloatReachesACudaPlanWithCastsAround) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  BuildOptions o;
  o.device = Device::kCuda;
  o.precision = Precision::kBf16;
  const ModelIR plain = build_model(fixture("bloom-tiny"), o, kQuiet);
  // The first Linear of the decoder, by its name in the plan.
  std::string layer;
  for (const Node& n : plain.graphs[0].nodes)
    if (n.op == OpKind::kLinear && layer.empty()) layer = n.name;
  ASSERT_FALSE(layer.empty());
  o.precision_options.keep_float = {layer};
  const ModelIR kept = build_model(fixture("bloom-tiny"), o, kQuiet);
  const Graph& g = kept.graphs[0];
  int found = 0;
  for (const Node& n : g.nodes)
    if (n.name == layer) {
      ++found;
      EXPECT_EQ(g.values[n.inputs[0]].dtype, DType::kF32);
      EXPECT_EQ(g.values[n.inputs[1]].dtype, DType::kF32);
      // Its input comes through a Cast from the bf16 layers around it.
      EXPECT_EQ(g.nodes[g.values[n.inputs[0]].producer].op, OpKind::kCast);
    }
  EXPECT_EQ(found, 1);
  const bool noted = std::any_of(
      kept.precision_notes.begin(), kept.precision_notes.end(), [&](const PrecisionNote& n) {
        return n.node == layer && n.reason.find("as the build asked") != std::string::npos;
      });
  EXPECT_TRUE(noted);
}

// A CPU fp16 plan with every Linear and Embedding kept in float stores the fp32 plan's weights
// and computes its logits, bit for bit (its KV cache is f32 as fp32's is: cpu_backend.cc).
TEST(PrecisionPlan, EveryLayerKeptInFloatIsTheFp32Plan) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions o;
  o.pack_for_cpu = CpuIsa::kAvx2;  // plain weights: the same kernels for both plans
  const ModelIR fp32 = build_model(fixture("t5-tiny"), o, kQuiet);
  o.precision = Precision::kFp16;
  for (const Graph& g : fp32.graphs)
    for (const Node& n : g.nodes)
      if (n.op == OpKind::kLinear || n.op == OpKind::kEmbedding)
        o.precision_options.keep_float.push_back(n.name);
  ASSERT_GT(o.precision_options.keep_float.size(), 10u);
  ModelIR kept = build_model(fixture("t5-tiny"), o, kQuiet);
  for (const Graph& g : kept.graphs)
    for (const Value& v : g.values) {
      EXPECT_NE(v.dtype, DType::kF16) << v.name;
    }
  o.precision_options.keep_float.clear();
  auto engine_kept = std::make_unique<CompiledModel>(ctx, std::move(kept));
  BuildOptions f;
  f.pack_for_cpu = CpuIsa::kAvx2;
  auto engine_fp32 =
      std::make_unique<CompiledModel>(ctx, build_model(fixture("t5-tiny"), f, kQuiet));
  const std::vector<int64_t> prompt = {37, 12, 5, 99, 1};
  const std::vector<int64_t> seq = {0, 12, 44};
  const Forward a = run_forward(*engine_kept, prompt, seq, false);
  const Forward b = run_forward(*engine_fp32, prompt, seq, false);
  ASSERT_EQ(a.logits.numel(), b.logits.numel());
  EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0);
}

}  // namespace
}  // namespace kiln::test
