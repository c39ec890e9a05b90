#include "backend/cuda/step_checks.h"

#include <string>

#include "backend/cuda/cuda_common.h"

namespace kiln::cuda {

StepChecks::StepChecks(LaunchStream& stream, const Logger& log, bool defer)
    : stream_(stream), log_(log), defer_(defer) {
  KILN_CUDA_CHECK(cudaMalloc(&status_, sizeof(DeviceStatus)));
  KILN_CUDA_CHECK(cudaMemset(status_, 0, sizeof(DeviceStatus)));
  KILN_CUDA_CHECK(cudaMallocHost(&status_host_, kMaxPending * sizeof(DeviceStatus)));
  for (int i = 0; i < kMaxPending; ++i) {
    status_host_[i] = DeviceStatus{};
    checks_[i].host = status_host_ + i;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&checks_[i].copied, cudaEventDisableTiming));
  }
}

StepChecks::~StepChecks() {
  cudaStreamSynchronize(stream_.stream());
  cudaFree(status_);
  cudaFreeHost(status_host_);
  for (PendingCheck& c : checks_)
    if (c.copied != nullptr) cudaEventDestroy(c.copied);
}

void StepChecks::finish_step(const Graph& graph, bool wait) {
  if (pending_ == kMaxPending) check_oldest();
  PendingCheck& c = checks_[(first_check_ + pending_) % kMaxPending];
  // A kernel, not a copy: between two decode steps each copy in the stream costs several
  // microseconds of the GPU's time, a kernel under programmatic launch about one.
  launch_publish_status(status_, c.host, stream_.kernel_stream());
  KILN_CUDA_CHECK(cudaGetLastError());
  KILN_CUDA_CHECK(cudaEventRecord(c.copied, stream_.stream()));
  c.graph = &graph;
  c.number = ++checks_made_;
  ++pending_;
  if (wait || !defer_) synchronize();
}

void StepChecks::check_oldest() {
  PendingCheck& c = checks_[first_check_];
  KILN_CUDA_CHECK(cudaEventSynchronize(c.copied));
  const Graph& graph = *c.graph;
  const DeviceStatus st = *c.host;
  first_check_ = (first_check_ + 1) % kMaxPending;
  --pending_;
  if (st.code == kStatusOk) return;
  // The status word keeps what the failed step wrote: the steps queued after it are not
  // checked on their own (their results are not trusted either), and the word is cleared.
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_.stream()));
  pending_ = 0;
  KILN_CUDA_CHECK(cudaMemsetAsync(status_, 0, sizeof(DeviceStatus), stream_.stream()));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_.stream()));
  const std::string node = st.node >= 0 && st.node < static_cast<int>(graph.nodes.size())
                               ? graph.nodes[st.node].name
                               : "?";
  switch (st.code) {
    case kStatusTokenId:
      KILN_FAIL("node '{}': token id {} is outside the vocabulary [0, {})", node, st.value,
                st.limit);
    case kStatusGatherRow:
      KILN_FAIL("node '{}': row {} out of range [0, {})", node, st.value, st.limit);
    case kStatusKvBlock:
      KILN_FAIL("node '{}': the block table names KV block {}, the storage holds {}", node,
                st.value, st.limit);
    default:
      KILN_FAIL("node '{}': the GPU reported error {}", node, st.code);
  }
}

void StepChecks::synchronize() {
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_.stream()));
  KILN_CUDA_CHECK(cudaGetLastError());
  while (pending_ > 0) check_oldest();
}

void StepChecks::abandon_step() {
  // The pending checks' copies were queued before this step's kernels: they stay, and hold
  // only what the steps before reported.
  cudaStreamSynchronize(stream_.stream());
  cudaMemsetAsync(status_, 0, sizeof(DeviceStatus), stream_.stream());
  cudaStreamSynchronize(stream_.stream());
}

void StepChecks::forget_step(const Graph& graph) {
  bool mine = false;
  for (int i = 0; i < pending_; ++i)
    mine |= checks_[(first_check_ + i) % kMaxPending].graph == &graph;
  if (!mine) return;
  try {
    synchronize();
  } catch (const std::exception& e) {
    log_.warn("graph '{}' went away with an unchecked step: {}", graph.name, e.what());
  }
}

}  // namespace kiln::cuda
