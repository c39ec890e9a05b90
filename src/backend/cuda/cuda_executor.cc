#include "backend/cuda/cuda_executor.h"

#include <algorithm>
#include <chrono>

#include "graph/workspace.h"

namespace kiln::cuda {
namespace {

int64_t aligned(int64_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

}  // namespace

CudaExecutor::CudaExecutor(const Graph& graph, const ShapeProfile& profile, CudaContext& ctx,
                           std::vector<std::unique_ptr<Kernel>> kernels,
                           std::vector<std::string> names)
    : graph_(graph),
      profile_(profile),
      ctx_(ctx),
      kernels_(std::move(kernels)),
      kernel_names_(std::move(names)) {
  KILN_CHECK(kernels_.size() == graph_.nodes.size(), "graph '{}': {} kernels for {} nodes",
             graph_.name, kernels_.size(), graph_.nodes.size());
  values_.resize(graph_.values.size());
  for (size_t i = 0; i < graph_.values.size(); ++i)
    if (graph_.values[i].kind == ValueKind::kWeight)
      values_[i] = ctx_.device_weight(graph_.values[i].data);
  for (const Node& n : graph_.nodes) has_attention_ |= n.op == OpKind::kAttention;
  if (ctx_.profile()) {
    events_.resize(graph_.nodes.size() + 1);
    for (cudaEvent_t& e : events_) KILN_CUDA_CHECK(cudaEventCreate(&e));
  }
}

CudaExecutor::~CudaExecutor() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (steps_ == 0) return;
  std::vector<std::pair<double, std::string>> by_time;
  double kernels = 0.0;
  for (const auto& [name, ms] : kernel_ms_) {
    by_time.emplace_back(ms, name);
    kernels += ms;
  }
  std::sort(by_time.rbegin(), by_time.rend());
  Logger& log = ctx_.host().log();
  log.info(
      "cuda profile of graph '{}': {} steps, {:.3f} ms per step (wall), {:.3f} ms of it in "
      "kernels (CUDA events)",
      graph_.name, steps_, step_ms_ / steps_, kernels / steps_);
  for (const auto& [ms, name] : by_time)
    log.info("  {:>9.4f} ms/step {:>5.1f}%  {}", ms / steps_, 100.0 * ms / kernels, name);
}

CudaExecutor::Arena& CudaExecutor::arena_for(int64_t bucket) {
  auto it = arenas_.find(bucket);
  if (it != arenas_.end()) return it->second;
  const Bindings bindings = profile_.bucket_bindings(bucket);
  const WorkspaceLayout layout = workspace_layout(graph_, bindings);
  Arena a;
  a.offset = layout.offset;
  int64_t at = aligned(layout.bytes);
  for (int id : graph_.inputs) {
    const Value& v = graph_.values[id];
    a.input_offset.push_back(at);
    at += aligned(static_cast<int64_t>(
        dtype_bytes(v.dtype, static_cast<size_t>(shape_numel(resolve_shape(v.shape, bindings))))));
  }
  int64_t scratch = 0;
  for (const auto& k : kernels_) scratch = std::max(scratch, k->workspace_bytes(bindings));
  a.scratch_offset = at;
  a.bytes = at + aligned(scratch);
  a.memory = ctx_.allocator().allocate(static_cast<size_t>(std::max<int64_t>(a.bytes, 256)));
  return arenas_.emplace(bucket, std::move(a)).first->second;
}

int64_t CudaExecutor::workspace_bytes() const {
  int64_t total = 0;
  for (const auto& [bucket, a] : arenas_) total += a.bytes;
  return total;
}

Bindings CudaExecutor::bind_inputs(std::span<const Tensor> inputs) const {
  KILN_CHECK(inputs.size() == graph_.inputs.size(), "graph '{}': {} inputs fed, expected {}",
             graph_.name, inputs.size(), graph_.inputs.size());
  Bindings bindings;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value& v = graph_.values[graph_.inputs[i]];
    const Tensor& t = inputs[i];
    KILN_CHECK(t.defined() && t.dtype() == v.dtype, "graph '{}': input '{}' is {}, expected {}",
               graph_.name, v.name, t.defined() ? dtype_name(t.dtype()) : "missing",
               dtype_name(v.dtype));
    KILN_CHECK(t.rank() == static_cast<int>(v.shape.size()),
               "graph '{}': input '{}' has shape {}, expected {}", graph_.name, v.name,
               shape_str(t.shape()), sym_shape_str(v.shape));
    for (size_t d = 0; d < v.shape.size(); ++d) {
      if (v.shape[d].is_symbolic()) {
        auto [pos, fresh] = bindings.emplace(v.shape[d].symbol, t.shape()[d]);
        KILN_CHECK(fresh || pos->second == t.shape()[d],
                   "graph '{}': input '{}' binds '{}' = {}, but another input bound it to {}",
                   graph_.name, v.name, v.shape[d].symbol, t.shape()[d], pos->second);
      } else {
        KILN_CHECK(t.shape()[d] == v.shape[d].value,
                   "graph '{}': input '{}' has shape {}, expected {}", graph_.name, v.name,
                   shape_str(t.shape()), sym_shape_str(v.shape));
      }
    }
  }
  return bindings;
}

std::span<const Tensor> CudaExecutor::execute(std::span<const Tensor> inputs,
                                              const StepContext* step) {
  const Bindings bindings = bind_inputs(inputs);
  // Graphs without a ragged token dimension (tests, fixed shapes) use the largest bucket.
  auto tokens = bindings.find("tokens");
  const int64_t step_tokens = tokens != bindings.end() ? tokens->second : profile_.max_step_tokens;
  KILN_CHECK(step_tokens > 0, "graph '{}': a step needs at least one token", graph_.name);
  const int64_t bucket = profile_.bucket_for(step_tokens);
  const Bindings limits = profile_.bucket_bindings(bucket);
  for (const auto& [symbol, value] : bindings) {
    auto cap = limits.find(symbol);
    KILN_CHECK(cap != limits.end() && value <= cap->second,
               "graph '{}': '{}' = {} exceeds the plan's limit of {}", graph_.name, symbol, value,
               cap == limits.end() ? 0 : cap->second);
  }
  if (has_attention_) {
    KILN_CHECK(step != nullptr && step->layout != nullptr,
               "graph '{}': attention needs the step's layout", graph_.name);
    KILN_CHECK(step->layout->total_tokens() == step_tokens,
               "graph '{}': step layout covers {} tokens, the inputs hold {}", graph_.name,
               step->layout->total_tokens(), step_tokens);
    step->layout->check(step->kv ? step->kv->geometry().block_size : 0);
    KILN_CHECK(step->kv == nullptr || step->kv->device() == Device::kCuda,
               "graph '{}': the KV storage is in {} memory, the cuda kernels read device memory",
               graph_.name, device_name(step->kv->device()));
    if (step->kv && !step->layout->copies.empty()) step->kv->copy_blocks(step->layout->copies);
    ctx_.upload_step(*step->layout);
  }
  Arena& arena = arena_for(bucket);
  char* base = static_cast<char*>(arena.memory.get());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int id = graph_.inputs[i];
    const Tensor& t = inputs[i];
    if (t.device() == Device::kCuda) {
      values_[id] = t;
      continue;
    }
    char* dst = base + arena.input_offset[i];
    if (t.nbytes() > 0)
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(dst, t.raw(), t.nbytes(), cudaMemcpyHostToDevice, ctx_.stream()));
    values_[id] = Tensor::view(t.dtype(), t.shape(), dst, arena.memory, Device::kCuda);
  }
  for (size_t id = 0; id < graph_.values.size(); ++id) {
    if (graph_.values[id].kind != ValueKind::kActivation) continue;
    values_[id] =
        Tensor::view(graph_.values[id].dtype, resolve_shape(graph_.values[id].shape, bindings),
                     base + arena.offset[id], arena.memory, Device::kCuda);
  }
  const auto wall0 = std::chrono::steady_clock::now();
  KernelArgs args;
  args.scratch = base + arena.scratch_offset;
  args.step = step;
  for (size_t n = 0; n < graph_.nodes.size(); ++n) {
    const Node& node = graph_.nodes[n];
    node_in_.clear();
    node_out_.clear();
    for (int id : node.inputs) node_in_.push_back(id >= 0 ? values_[id] : Tensor());
    for (int id : node.outputs) node_out_.push_back(values_[id]);
    args.in = node_in_;
    args.out = node_out_;
    if (!events_.empty()) KILN_CUDA_CHECK(cudaEventRecord(events_[n], ctx_.stream()));
    kernels_[n]->run(args);
  }
  if (!events_.empty())
    KILN_CUDA_CHECK(cudaEventRecord(events_[graph_.nodes.size()], ctx_.stream()));
  ctx_.finish_step(graph_);
  if (!events_.empty()) {
    for (size_t n = 0; n < graph_.nodes.size(); ++n) {
      float ms = 0.0f;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[n], events_[n + 1]));
      kernel_ms_[kernel_names_[n] + " -> " +
                 sym_shape_str(graph_.values[graph_.nodes[n].outputs[0]].shape)] += ms;
    }
    step_ms_ +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count();
    ++steps_;
  }
  outputs_.clear();
  for (int id : graph_.outputs) outputs_.push_back(values_[id]);
  return outputs_;
}

}  // namespace kiln::cuda
