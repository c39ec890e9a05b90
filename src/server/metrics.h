// The /metrics page: Triton's per-model metric names and labels (nv_inference_*, labelled
// model="..",version=".."), kiln's own token, batch and KV-cache metrics (kiln_*), and the GPU
// metrics when NVML is there. docs/serving.md lists every metric.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/generation_executor.h"

namespace kiln::server {

class GpuMetrics;
class ModelManager;

// One loaded model version, as the page shows it.
struct ModelMetrics {
  std::string name;
  int64_t version = 0;
  int64_t instances = 0;
  // Requests refused before they reached an executor (LoadedModel::refused).
  int64_t refused = 0;
  ExecutorStats stats;  // summed over the instances
};

// A snapshot of every loaded model version (sorted by name, then version).
std::vector<ModelMetrics> collect_model_metrics(const ModelManager& models);

// The model families of the page; a pure function of the snapshot, so tests need no model.
std::string render_model_metrics(const std::vector<ModelMetrics>& models);

// The whole page: the models' families, then the GPUs' (none when `gpu` is null).
std::string render_metrics(const ModelManager& models, const GpuMetrics* gpu);

// Triton's failure reasons (label reason="..." of nv_inference_request_failure) and what each
// counts here; see the comment at the mapping in metrics.cc.
struct FailureCounts {
  int64_t rejected = 0, canceled = 0, backend = 0, other = 0;
};
FailureCounts failure_counts(const ModelMetrics& m);

}  // namespace kiln::server
