// The shared graph executor: one workspace per graph, allocated when a step's bucket needs more
// than it has (never per step) and reused; each step's activations are laid out for its own
// shapes at the workspace's front, so a short step in a large bucket writes only a short step's
// bytes; inputs and outputs are addressed by position; streamed outputs go to the step's sink.
#include <gtest/gtest.h>

#include "../models/parity_util.h"
#include "backend/executor.h"
#include "builder/builder.h"
#include "graph/workspace.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

TEST(Executor, OneWorkspaceGrowsToTheLargestBucketAndEachStepUsesItsFront) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto model = compile_model_dir(ctx, fixture("bloom-tiny"));
  const ModelIR& ir = model->model();
  const Graph& graph = ir.graph(kDecoderGraph);
  Executable& dec = model->decoder();
  const auto* exec = dynamic_cast<const GraphExecutor*>(&dec);
  ASSERT_NE(exec, nullptr);
  const auto io = model->decoder_io();
  auto kv = model->backend().create_kv_storage(
      KvGeometry{model->desc().cache_layers, model->desc().cache_row_width(), 16, DType::kF32});
  kv->resize(8);
  Bindings bound;  // the last step's bindings
  auto step = [&](int64_t tokens) {
    StepLayout layout;
    layout.clear();
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b * 16 < tokens; ++b) blocks.push_back(b);
    layout.add_sequence(tokens, 0, blocks, nullptr);
    std::vector<Tensor> in(graph.inputs.size());
    in[io.input_ids] = Tensor::from_vector(std::vector<int64_t>(tokens, 5), {tokens});
    in[io.logit_rows] = Tensor::from_vector(std::vector<int64_t>{tokens - 1}, {1});
    bound = bind_step_inputs(graph, ir.profile, in).bindings;
    StepContext ctx_step{&layout, kv.get()};
    return static_cast<const char*>(dec.execute(in, &ctx_step)[io.logits].raw());
  };
  // The logits sit where the step's own layout puts them (a layout for the bucket's bounds
  // would put them behind slots sized for 16 or 64 tokens).
  const int logits_id = graph.outputs[static_cast<size_t>(io.logits)];
  auto at_own_offset = [&](const char* logits) {
    return logits - static_cast<const char*>(exec->workspace_base()) ==
           workspace_layout(graph, bound).offset[static_cast<size_t>(logits_id)];
  };
  EXPECT_EQ(dec.workspace_bytes(), 0) << "nothing before the first step";
  // Plus the kernels' scratch: the AVX-512 Linear interleaves its (up to 16) input rows.
  int64_t scratch = 0;
  if (ctx.cpu_isa() == CpuIsa::kAvx512)
    for (const Node& n : graph.nodes)
      if (n.op == OpKind::kLinear)
        scratch = std::max<int64_t>(scratch, 16 * graph.values[n.inputs[1]].data.dim(1) * 4);
  const int64_t scratch_bytes = (scratch + 63) / 64 * 64;
  EXPECT_TRUE(at_own_offset(step(3)));
  const int64_t small = dec.workspace_bytes();
  EXPECT_EQ(small, workspace_layout(graph, ir.profile.bucket_bindings(16)).bytes + scratch_bytes)
      << "sized for the 16-token bucket: its planned workspace and the kernels' scratch";
  const void* first_base = exec->workspace_base();
  EXPECT_TRUE(at_own_offset(step(16)));
  EXPECT_EQ(dec.workspace_bytes(), small) << "same bucket: no allocation";
  EXPECT_EQ(exec->workspace_base(), first_base);
  EXPECT_TRUE(at_own_offset(step(40)));  // the 64-token bucket: the workspace grows
  const int64_t grown = dec.workspace_bytes();
  // (Its kernels' scratch grows with the bucket too: the prompt attention's.)
  EXPECT_GE(grown, workspace_layout(graph, ir.profile.bucket_bindings(64)).bytes + scratch_bytes);
  const void* grown_base = exec->workspace_base();
  EXPECT_TRUE(at_own_offset(step(2))) << "a small step at the front of the grown workspace";
  EXPECT_TRUE(at_own_offset(step(64)));
  EXPECT_EQ(dec.workspace_bytes(), grown) << "no allocation for a bucket it already holds";
  EXPECT_EQ(exec->workspace_base(), grown_base);
}

TEST(Executor, BadInputStepBeyondTheProfileIsRefused) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions o;
  o.max_input_tokens = 32;
  o.max_batch = 4;
  auto model = compile_model_dir(ctx, fixture("bloom-tiny"), o);
  const auto io = model->decoder_io();
  const int64_t tokens = model->model().profile.max_step_tokens + 1;
  StepLayout layout;
  layout.clear();
  layout.add_sequence(tokens, 0, {}, nullptr);
  std::vector<Tensor> in(2);
  in[io.input_ids] = Tensor::from_vector(std::vector<int64_t>(tokens, 5), {tokens});
  in[io.logit_rows] = Tensor::from_vector(std::vector<int64_t>{0}, {1});
  StepContext step{&layout, nullptr};
  try {
    model->decoder().execute(in, &step);
    ADD_FAILURE() << "a step larger than the profile ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("limit"), std::string::npos) << e.what();
  }
  std::vector<Tensor> short_in(1);
  EXPECT_THROW(model->decoder().execute(short_in, &step), Error) << "inputs by position, all";
}

// Records clones of the streamed outputs it is handed, in order.
class RecordingSink final : public OutputSink {
 public:
  void take(int output, const Tensor& value) override {
    order.push_back(output);
    values[output] = value.clone();
  }
  std::vector<int> order;
  std::map<int, Tensor> values;
};

// A CPU plan's T5 encoder streams its outputs: each reaches the sink as its node writes it, with
// the values the same graph computes when every output keeps a buffer of its own, in a smaller
// workspace; without a sink the step is refused.
TEST(Executor, StreamedOutputsReachTheSinkAsWrittenWithTheValuesOfKeptOutputs) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto model = compile_model_dir(ctx, fixture("t5-tiny"));
  const ModelIR& ir = model->model();
  const Graph& streamed = ir.graph(kEncoderGraph);
  ASSERT_TRUE(streamed.streams_outputs());
  Graph kept = streamed;
  plan_memory(kept, Logger(LogLevel::kError), ir.profile.bucket_bindings(16), false);
  ASSERT_FALSE(kept.streams_outputs());
  const Bindings at = ir.profile.bucket_bindings(ir.profile.token_buckets.back());
  EXPECT_LT(workspace_layout(streamed, at).bytes, workspace_layout(kept, at).bytes)
      << "the cross K/V projections share buffers";
  std::unique_ptr<Executable> kept_exec = model->backend().compile(kept, ir.profile);

  const std::vector<int64_t> prompt = {37, 5, 120, 9, 64, 3, 1};
  StepLayout layout;
  layout.clear();
  layout.add_sequence(static_cast<int64_t>(prompt.size()), 0, {}, nullptr);
  std::vector<Tensor> in(streamed.inputs.size());
  in[streamed.input_index("input_ids")] =
      Tensor::from_vector(prompt, {static_cast<int64_t>(prompt.size())});
  StepContext step{&layout, nullptr};
  try {
    model->encoder().execute(in, &step);
    ADD_FAILURE() << "a streaming graph ran without a sink";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("OutputSink"), std::string::npos) << e.what();
  }
  RecordingSink sink;
  step.sink = &sink;
  const std::span<const Tensor> out = model->encoder().execute(in, &step);
  for (const Tensor& t : out) EXPECT_FALSE(t.defined()) << "streamed outputs are not returned";
  ASSERT_EQ(sink.order.size(), streamed.outputs.size()) << "each output once";
  // In the order their nodes run.
  for (size_t i = 1; i < sink.order.size(); ++i)
    EXPECT_LT(streamed.values[streamed.outputs[sink.order[i - 1]]].producer,
              streamed.values[streamed.outputs[sink.order[i]]].producer);
  StepContext plain{&layout, nullptr};
  const std::span<const Tensor> want = kept_exec->execute(in, &plain);
  for (size_t o = 0; o < want.size(); ++o) {
    SCOPED_TRACE(streamed.values[streamed.outputs[o]].name);
    const Tensor& got = sink.values.at(static_cast<int>(o));
    ASSERT_EQ(got.shape(), want[o].shape());
    EXPECT_EQ(std::memcmp(got.raw(), want[o].raw(), got.nbytes()), 0);
  }
}

}  // namespace
}  // namespace kiln::test
