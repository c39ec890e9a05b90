#include "server/metrics.h"

#include <algorithm>
#include <array>

#include "server/exposition.h"
#include "server/gpu_metrics.h"
#include "server/model_manager.h"

namespace kiln::server {

namespace {

Labels model_labels(const ModelMetrics& m) {
  return {{"model", m.name}, {"version", std::to_string(m.version)}};
}

// Writes one family: its header, then one sample per model (families must stay together).
template <typename Value>
void per_model(Exposition& out, const std::vector<ModelMetrics>& models, const char* name,
               MetricType type, const char* help, Value value) {
  out.family(name, type, help);
  for (const ModelMetrics& m : models) out.sample(name, model_labels(m), value(m));
}

void per_model_histogram(Exposition& out, const std::vector<ModelMetrics>& models, const char* name,
                         const char* help, const Histogram ExecutorStats::*field) {
  out.family(name, MetricType::kHistogram, help);
  for (const ModelMetrics& m : models) out.histogram(name, model_labels(m), m.stats.*field);
}

}  // namespace

FailureCounts failure_counts(const ModelMetrics& m) {
  // Triton's reasons (docs/user_guide/metrics.md, "Failure Count Categories"): REJECTED is a
  // request the scheduler gave up on before running it (Triton: its queue timeout; its full
  // queue refuses the same way, UNAVAILABLE), CANCELED a cancelled request, BACKEND a failure
  // while the model ran, OTHER the core's other failures: kiln's total-time deadline (which can
  // end a running request, unlike Triton's queue timeout) and requests refused before they
  // reached an executor (bad parameters).
  FailureCounts f;
  f.rejected = m.stats.rejected + m.stats.queue_timeouts;
  f.canceled = m.stats.cancelled;
  f.backend = m.stats.errors;
  f.other = m.stats.timeouts + m.refused;
  return f;
}

std::vector<ModelMetrics> collect_model_metrics(const ModelManager& models) {
  std::vector<ModelMetrics> out;
  for (const std::shared_ptr<LoadedModel>& lm : models.ready_models()) {
    ModelMetrics m;
    m.name = lm->name();
    m.version = lm->version();
    m.instances = static_cast<int64_t>(lm->instance_count());
    m.refused = lm->refused.load();
    m.stats = lm->stats();
    out.push_back(std::move(m));
  }
  std::sort(out.begin(), out.end(), [](const ModelMetrics& a, const ModelMetrics& b) {
    return a.name != b.name ? a.name < b.name : a.version < b.version;
  });
  return out;
}

std::string render_model_metrics(const std::vector<ModelMetrics>& models) {
  Exposition out;
  using M = const ModelMetrics&;
  // --- Triton's names ---
  per_model(out, models, "nv_inference_request_success", MetricType::kCounter,
            "Number of successful inference requests, all batch sizes",
            [](M m) { return m.stats.success; });
  out.family("nv_inference_request_failure", MetricType::kCounter,
             "Number of failed inference requests, all batch sizes");
  for (const ModelMetrics& m : models) {
    const FailureCounts f = failure_counts(m);
    const std::pair<const char*, int64_t> reasons[] = {{"REJECTED", f.rejected},
                                                       {"CANCELED", f.canceled},
                                                       {"BACKEND", f.backend},
                                                       {"OTHER", f.other}};
    for (const auto& [reason, n] : reasons) {
      Labels labels = model_labels(m);
      labels.emplace_back("reason", reason);
      out.sample("nv_inference_request_failure", labels, n);
    }
  }
  // One request is one inference (a prompt per request; Triton counts a batch of n as n).
  per_model(out, models, "nv_inference_count", MetricType::kCounter,
            "Number of inferences performed (does not include cached requests)",
            [](M m) { return m.stats.success; });
  per_model(out, models, "nv_inference_exec_count", MetricType::kCounter,
            "Number of model executions performed (decoder steps; does not include cached "
            "requests)",
            [](M m) { return m.stats.steps; });
  per_model(out, models, "nv_inference_request_duration_us", MetricType::kCounter,
            "Cumulative inference request duration in microseconds (includes cached requests)",
            [](M m) { return m.stats.request_us; });
  per_model(out, models, "nv_inference_queue_duration_us", MetricType::kCounter,
            "Cumulative inference queuing duration in microseconds (includes cached requests)",
            [](M m) { return m.stats.queue_us; });
  per_model(out, models, "nv_inference_compute_infer_duration_us", MetricType::kCounter,
            "Cumulative compute inference duration in microseconds (does not include cached "
            "requests)",
            [](M m) { return m.stats.compute_us; });
  // Triton's pending requests are those not executing yet: enqueued minus running. The two
  // numbers are read at slightly different times, hence the clamp.
  per_model(out, models, "nv_inference_pending_request_count", MetricType::kGauge,
            "Instantaneous number of pending requests awaiting execution per-model.",
            [](M m) { return std::max<int64_t>(0, m.stats.pending - m.stats.running); });

  // --- kiln's own ---
  per_model_histogram(out, models, "kiln_time_to_first_token_seconds",
                      "Time from enqueueing a request to its first generated token",
                      &ExecutorStats::ttft_seconds);
  per_model_histogram(out, models, "kiln_inter_token_latency_seconds",
                      "Time between consecutive generated tokens of a request",
                      &ExecutorStats::inter_token_seconds);
  per_model_histogram(out, models, "kiln_generated_tokens_per_request",
                      "Tokens generated per successful request",
                      &ExecutorStats::output_tokens_per_request);
  per_model_histogram(
      out, models, "kiln_batch_size",
      "Requests in the running batch, observed after each decoder step that leaves some "
      "running",
      &ExecutorStats::batch_size);
  per_model(out, models, "kiln_running_sequences", MetricType::kGauge,
            "Requests in the running batch as of the last step",
            [](M m) { return m.stats.running; });
  per_model(out, models, "kiln_kv_blocks_used", MetricType::kGauge,
            "KV-cache blocks held by running requests", [](M m) { return m.stats.kv_blocks_used; });
  // Free blocks only mean something against a budget: without one the cache grows on demand.
  out.family("kiln_kv_blocks_free", MetricType::kGauge,
             "KV-cache blocks left within the budget (models with kv_budget_blocks only)");
  for (const ModelMetrics& m : models)
    if (m.stats.kv_blocks_budget > 0)
      out.sample("kiln_kv_blocks_free", model_labels(m),
                 std::max<int64_t>(0, m.stats.kv_blocks_budget - m.stats.kv_blocks_used));
  per_model(out, models, "kiln_kv_cache_bytes", MetricType::kGauge,
            "Bytes allocated for the KV cache", [](M m) { return m.stats.kv_bytes_allocated; });
  per_model(out, models, "kiln_preemptions_total", MetricType::kCounter,
            "Requests preempted (KV blocks given back, recomputed later) to make room",
            [](M m) { return m.stats.preemptions; });
  per_model(out, models, "kiln_steps_run_ahead_total", MetricType::kCounter,
            "Decoder steps queued before the tokens of the step before them were read (no host "
            "gap between the two; of nv_inference_exec_count)",
            [](M m) { return m.stats.steps_ahead; });
  per_model(out, models, "kiln_encoder_steps_total", MetricType::kCounter,
            "Encoder steps run (encoder-decoder models): the prompts that joined between two of "
            "them shared one",
            [](M m) { return m.stats.encoder_steps; });
  // How steps were launched: a served batch whose shape keeps changing is captured or run kernel
  // by kernel more often than a benchmark's, which replays one shape.
  out.family("kiln_step_launches_total", MetricType::kCounter,
             "Steps by graph (decoder, encoder) and launch: replayed (a captured CUDA graph), "
             "captured (a shape seen the second time), eager (kernel by kernel); 0 on the cpu, "
             "which does not replay steps");
  auto graphs = [](const ModelMetrics& m) {
    return std::array<std::pair<const char*, const StepLaunchStats*>, 2>{
        {{"decoder", &m.stats.decoder_launches}, {"encoder", &m.stats.encoder_launches}}};
  };
  for (const ModelMetrics& m : models)
    for (const auto& [graph, s] : graphs(m))
      for (const auto& [launch, n] : {std::pair<const char*, int64_t>{"replayed", s->replayed},
                                      {"captured", s->captured},
                                      {"eager", s->eager}}) {
        Labels labels = model_labels(m);
        labels.emplace_back("graph", graph);
        labels.emplace_back("launch", launch);
        out.sample("kiln_step_launches_total", labels, n);
      }
  out.family("kiln_step_capture_seconds_total", MetricType::kCounter,
             "Host time spent capturing and instantiating CUDA graphs of steps");
  for (const ModelMetrics& m : models)
    for (const auto& [graph, s] : graphs(m)) {
      Labels labels = model_labels(m);
      labels.emplace_back("graph", graph);
      out.sample("kiln_step_capture_seconds_total", labels, s->capture_ms / 1000.0);
    }
  per_model(out, models, "kiln_input_tokens_total", MetricType::kCounter,
            "Prompt tokens of finished requests", [](M m) { return m.stats.input_tokens; });
  per_model(out, models, "kiln_output_tokens_total", MetricType::kCounter,
            "Tokens generated by finished requests", [](M m) { return m.stats.output_tokens; });
  per_model(out, models, "kiln_engine_busy_seconds_total", MetricType::kCounter,
            "Time the engine threads spent running steps (rate() is their utilization)",
            [](M m) { return static_cast<double>(m.stats.busy_us) / 1e6; });
  per_model(out, models, "kiln_model_instances", MetricType::kGauge,
            "Instances (engine threads) serving the model version",
            [](M m) { return m.instances; });
  return out.take();
}

std::string render_metrics(const ModelManager& models, const GpuMetrics* gpu) {
  std::string page = render_model_metrics(collect_model_metrics(models));
  if (gpu != nullptr) page += gpu->render();
  return page;
}

}  // namespace kiln::server
