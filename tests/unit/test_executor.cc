// The shared graph executor: workspaces are allocated once per shape bucket and reused, so a
// step allocates nothing and its tensors sit at the same addresses every time (what CUDA-graph
// capture needs); inputs and outputs are addressed by position.
#include <gtest/gtest.h>

#include "../models/parity_util.h"
#include "backend/executor.h"
#include "builder/builder.h"
#include "graph/workspace.h"

namespace kiln::test {
namespace {

TEST(Executor, WorkspacesAreAllocatedOncePerBucketAndReused) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto model = compile_model_dir(ctx, fixture("bloom-tiny"));
  const ModelIR& ir = model->model();
  Executable& dec = model->decoder();
  const auto io = model->decoder_io();
  auto kv = model->backend().create_kv_storage(
      KvGeometry{model->desc().cache_layers, model->desc().cache_row_width(), 16, DType::kF32});
  kv->resize(8);
  auto step = [&](int64_t tokens) {
    StepLayout layout;
    layout.clear();
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b * 16 < tokens; ++b) blocks.push_back(b);
    layout.add_sequence(tokens, 0, blocks, nullptr);
    std::vector<Tensor> in(ir.graph(kDecoderGraph).inputs.size());
    in[io.input_ids] = Tensor::from_vector(std::vector<int64_t>(tokens, 5), {tokens});
    in[io.logit_rows] = Tensor::from_vector(std::vector<int64_t>{tokens - 1}, {1});
    StepContext ctx_step{&layout, kv.get()};
    return dec.execute(in, &ctx_step)[io.logits].raw();
  };
  EXPECT_EQ(dec.workspace_bytes(), 0) << "nothing before the first step";
  const void* first = step(3);
  const int64_t small = dec.workspace_bytes();
  const Bindings b16 = ir.profile.bucket_bindings(16);
  // Plus the kernels' scratch: the AVX-512 Linear interleaves its (up to 16) input rows.
  int64_t scratch = 0;
  if (ctx.cpu_isa() == CpuIsa::kAvx512)
    for (const Node& n : ir.graph(kDecoderGraph).nodes)
      if (n.op == OpKind::kLinear)
        scratch = std::max<int64_t>(
            scratch, 16 * ir.graph(kDecoderGraph).values[n.inputs[1]].data.dim(1) * 4);
  EXPECT_EQ(small, workspace_layout(ir.graph(kDecoderGraph), b16).bytes + (scratch + 63) / 64 * 64)
      << "the 16-token bucket's arena is exactly the planned workspace and the kernels' scratch";
  EXPECT_EQ(step(16), first) << "same bucket: same arena, same addresses";
  EXPECT_EQ(dec.workspace_bytes(), small);
  step(40);  // the 64-token bucket
  const int64_t both = dec.workspace_bytes();
  EXPECT_GT(both, small);
  EXPECT_EQ(step(2), first) << "back to the first bucket: its arena was kept";
  step(64);
  EXPECT_EQ(dec.workspace_bytes(), both) << "no allocation for a bucket seen before";
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

}  // namespace
}  // namespace kiln::test
