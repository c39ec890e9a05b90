// The activation observer (backend/observer.h): an executable hands the values a selection
// chooses to a callback, step by step; checked against values recomputed by hand from the
// graph's weights. CudaObserver* runs the same on the GPU (skipped without one), where observed
// steps run kernel by kernel instead of from captured CUDA graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../models/parity_util.h"
#include "backend/backend.h"
#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "graph/builder.h"
#include "runtime/compiled_model.h"
#include "runtime/encoder_run.h"

namespace kiln::test {
namespace {

constexpr int64_t kIn = 8, kHidden = 16, kOut = 4;

std::vector<float> ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 7) % 11 - 5) + offset;
  return v;
}

// x [tokens, kIn] -> "up" (w1 [kHidden, kIn], b1) -> "act" (relu) -> "down" (w2 [kOut, kHidden])
struct TwoLinears {
  Graph graph;
  std::vector<float> w1 = ramp(kHidden * kIn, 0.05f, 0.01f);
  std::vector<float> b1 = ramp(kHidden, 0.1f, 0.0f);
  std::vector<float> w2 = ramp(kOut * kHidden, 0.03f, -0.02f);

  TwoLinears() {
    GraphBuilder b("two_linears");
    const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(kIn)});
    const int w1v = b.weight("up.weight", Tensor::from_vector(w1, {kHidden, kIn}));
    const int b1v = b.weight("up.bias", Tensor::from_vector(b1, {kHidden}));
    const int w2v = b.weight("down.weight", Tensor::from_vector(w2, {kOut, kHidden}));
    const int up = b.linear(x, w1v, b1v, "up");
    const int act = b.activation(up, Activation::kRelu, "act");
    b.output(b.linear(act, w2v, -1, "down"), "y");
    graph = b.finish();
  }
  // relu(x · w1ᵀ + b1) for row r of x, by hand.
  std::vector<float> hidden(const std::vector<float>& x, int64_t r) const {
    std::vector<float> h(kHidden);
    for (int64_t j = 0; j < kHidden; ++j) {
      double sum = b1[j];
      for (int64_t i = 0; i < kIn; ++i) sum += double{x[r * kIn + i]} * w1[j * kIn + i];
      h[j] = static_cast<float>(std::max(sum, 0.0));
    }
    return h;
  }
};

ShapeProfile small_profile() {
  ShapeProfile p;
  p.max_input_tokens = p.max_step_tokens = 16;
  p.max_batch = 4;
  p.token_buckets = {16};
  return p;
}

struct Seen {
  std::string graph, node;
  int node_id = 0;
  int64_t step = 0;
  Shape shape;
  std::vector<float> values;
};

ActivationObserver recorder(ObserverSelection selection, std::vector<Seen>* seen) {
  ActivationObserver o;
  o.selection = std::move(selection);
  o.callback = [seen](const Observation& ob) {
    EXPECT_EQ(ob.value.device(), Device::kCpu) << "observed values are host tensors";
    EXPECT_EQ(ob.value.dtype(), DType::kF32);
    const float* p = ob.value.data<float>();
    seen->push_back({ob.graph.name, ob.node_name, ob.node, ob.step, ob.value.shape(),
                     std::vector<float>(p, p + ob.value.numel())});
  };
  return o;
}

// Runs three steps of 3, 1 and 5 tokens on `backend` observing every Linear's input, and
// checks each against the graph input ("up") or the hidden activation by hand ("down").
void check_linear_inputs(Backend& backend, float tolerance) {
  TwoLinears m;
  auto exe = backend.compile(m.graph, small_profile());
  std::vector<Seen> seen;
  exe->set_observer(recorder({.ops = {OpKind::kLinear}}, &seen));
  const std::vector<int64_t> tokens = {3, 1, 5};
  std::vector<std::vector<float>> inputs;
  for (size_t s = 0; s < tokens.size(); ++s) {
    inputs.push_back(ramp(tokens[s] * kIn, 0.3f, 0.1f * static_cast<float>(s)));
    const Tensor x = Tensor::from_vector(inputs.back(), {tokens[s], kIn});
    exe->execute(std::span<const Tensor>(&x, 1), nullptr);
  }
  ASSERT_EQ(seen.size(), 2 * tokens.size()) << "two Linears a step";
  for (size_t s = 0; s < tokens.size(); ++s) {
    const Seen& up = seen[2 * s];
    const Seen& down = seen[2 * s + 1];
    EXPECT_EQ(up.graph, "two_linears");
    EXPECT_EQ(up.node, "up");
    EXPECT_EQ(down.node, "down");
    EXPECT_EQ(m.graph.nodes[static_cast<size_t>(down.node_id)].name, "down");
    EXPECT_EQ(up.step, static_cast<int64_t>(s));
    EXPECT_EQ(down.step, static_cast<int64_t>(s));
    EXPECT_EQ(up.shape, (Shape{tokens[s], kIn}));
    ASSERT_EQ(down.shape, (Shape{tokens[s], kHidden}));
    EXPECT_EQ(up.values, inputs[s]) << "the graph input itself";
    for (int64_t r = 0; r < tokens[s]; ++r) {
      const std::vector<float> h = m.hidden(inputs[s], r);
      for (int64_t j = 0; j < kHidden; ++j)
        EXPECT_NEAR(down.values[r * kHidden + j], h[j], tolerance)
            << "step " << s << " row " << r << " feature " << j;
    }
  }
  // Without a callback nothing more is reported, and the steps still run.
  exe->set_observer({});
  const Tensor x = Tensor::from_vector(inputs[0], {tokens[0], kIn});
  exe->execute(std::span<const Tensor>(&x, 1), nullptr);
  EXPECT_EQ(seen.size(), 2 * tokens.size());
}

TEST(Observer, EveryLinearInputOnTheCpuMatchesTheHandComputedValue) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto cpu = make_cpu_backend(ctx);
  check_linear_inputs(*cpu, 1e-5f);
}

TEST(Observer, OutputsByNameAndStepNumbersRestartWithANewObserver) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto cpu = make_cpu_backend(ctx);
  TwoLinears m;
  auto exe = cpu->compile(m.graph, small_profile());
  const std::vector<float> in = ramp(2 * kIn, 0.25f, -0.1f);
  const Tensor x = Tensor::from_vector(in, {2, kIn});
  exe->execute(std::span<const Tensor>(&x, 1), nullptr);  // before any observer
  std::vector<Seen> seen;
  exe->set_observer(recorder({.names = {"act"}, .side = ObservedSide::kOutput, .slot = 0}, &seen));
  exe->execute(std::span<const Tensor>(&x, 1), nullptr);
  exe->execute(std::span<const Tensor>(&x, 1), nullptr);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].node, "act");
  EXPECT_EQ(seen[0].step, 0) << "steps count from the observer's setting";
  EXPECT_EQ(seen[1].step, 1);
  for (int64_t r = 0; r < 2; ++r) {
    const std::vector<float> h = m.hidden(in, r);
    for (int64_t j = 0; j < kHidden; ++j) EXPECT_NEAR(seen[1].values[r * kHidden + j], h[j], 1e-5f);
  }
}

TEST(Observer, BadInputSelectionsAreRefusedByName) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto cpu = make_cpu_backend(ctx);
  TwoLinears m;
  auto exe = cpu->compile(m.graph, small_profile());
  auto noop = [](const Observation&) {};
  try {
    exe->set_observer({{.names = {"no_such_node"}}, noop});
    FAIL() << "an unknown node name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_node"), std::string::npos) << e.what();
  }
  try {
    exe->set_observer({{.ops = {OpKind::kLinear}, .slot = 2}, noop});  // "down" has no bias
    FAIL() << "a Linear without a bias was observed at its bias slot";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'down'"), std::string::npos) << e.what();
  }
}

// A whole model: each executable gets the names its graph has; a name in neither is refused.
TEST(Observer, CompiledModelObservesEncoderAndDecoder) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto model = compile_model_dir(ctx, fixture("t5-tiny"));
  const ModelIR& ir = model->model();
  int encoder_linears = 0;
  for (const Node& n : ir.graph(kEncoderGraph).nodes) encoder_linears += n.op == OpKind::kLinear;
  ASSERT_GT(encoder_linears, 0);
  const std::string decoder_node = ir.graph(kDecoderGraph).nodes.back().name;
  std::vector<Seen> seen;
  model->set_observer(recorder(
      {.ops = {OpKind::kLinear}, .names = {decoder_node}, .side = ObservedSide::kOutput}, &seen));
  const EncoderIo& io = model->encoder_io();
  const Graph& enc = ir.graph(kEncoderGraph);
  std::vector<Tensor> in(enc.inputs.size());
  in[io.input_ids] = Tensor::from_vector(std::vector<int64_t>{5, 6, 7, 1}, {4});
  StepLayout layout;
  layout.add_sequence(4, 0, {}, nullptr);
  run_encoder(model->encoder(), enc, io, model->backend(), ir.precision, in,
              StepContext{&layout, nullptr});
  ASSERT_EQ(seen.size(), static_cast<size_t>(encoder_linears));
  for (const Seen& s : seen) {
    EXPECT_EQ(s.graph, kEncoderGraph);
    EXPECT_EQ(s.step, 0);
    EXPECT_EQ(s.shape[0], 4) << s.node << ": one row per token";
  }
  ActivationObserver stray;
  stray.selection.names = {"no_such_node"};
  stray.callback = [](const Observation&) {};
  EXPECT_THROW(model->set_observer(stray), Error);
}

TEST(CudaObserver, EveryLinearInputOnTheGpuMatchesTheHandComputedValue) {
  if (query_cuda().device_count == 0) GTEST_SKIP() << "no GPU visible";
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto cuda = make_cuda_backend(ctx);
  // Three steps of one shape each too: the second would be captured into a CUDA graph and the
  // third replayed, were the steps not observed.
  check_linear_inputs(*cuda, 1e-4f);
  TwoLinears m;
  auto exe = cuda->compile(m.graph, small_profile());
  std::vector<Seen> seen;
  exe->set_observer(recorder({.ops = {OpKind::kLinear}}, &seen));
  const std::vector<float> in = ramp(2 * kIn, 0.2f, 0.05f);
  const Tensor x = Tensor::from_vector(in, {2, kIn});
  for (int s = 0; s < 3; ++s) exe->execute(std::span<const Tensor>(&x, 1), nullptr);
  ASSERT_EQ(seen.size(), 6u);
  for (int64_t r = 0; r < 2; ++r) {
    const std::vector<float> h = m.hidden(in, r);
    for (int64_t j = 0; j < kHidden; ++j)
      EXPECT_NEAR(seen[5].values[r * kHidden + j], h[j], 1e-4f) << "third step, row " << r;
  }
  EXPECT_EQ(seen[5].step, 2);
}

}  // namespace
}  // namespace kiln::test
