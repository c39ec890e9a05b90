// Loaded models: each version's instances (a CompiledModel with its own Context and a
// GenerationExecutor: an engine thread), their states for the repository index, loading and
// unloading in Triton's model control modes, and the round-robin choice of an instance.
//
// Thread-safety: every method may be called from any thread. A model in use stays alive while
// requests hold it (shared_ptr): unloading removes it from the table and it drains in the
// background of the last holder.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/context.h"
#include "runtime/compiled_model.h"
#include "runtime/generation_executor.h"
#include "server/model_repository.h"

namespace kiln::server {

struct Instance {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompiledModel> model;
  std::unique_ptr<GenerationExecutor> executor;
};

class LoadedModel {
 public:
  LoadedModel(std::string name, int64_t version, ModelSettings settings,
              std::vector<std::unique_ptr<Instance>> instances);
  ~LoadedModel();  // drains and joins the engine threads

  const std::string& name() const { return name_; }
  int64_t version() const { return version_; }
  const ModelSettings& settings() const { return settings_; }
  // The first instance's model: its description, tokenizer, profile (all instances are alike).
  const CompiledModel& model() const { return *instances_.front()->model; }
  const std::string& prompt_template() const { return prompt_template_; }
  // The instance with the fewest requests in flight (round-robin among equals).
  GenerationExecutor& pick();
  size_t instance_count() const { return instances_.size(); }
  GenerationExecutor& executor(size_t i) { return *instances_[i]->executor; }
  // Sums over the instances (histograms merged).
  ExecutorStats stats() const;
  int64_t in_flight() const;
  // Stops taking requests, waits for those in flight until `until`, cancels the rest.
  bool drain(Clock::time_point until);
  // Triton's per-model counters that the executors do not keep: requests refused before they
  // reached an executor (bad parameters), by protocol code.
  std::atomic<int64_t> refused{0};
  // Triton's failure count (both protocols' statistics): requests that ended in an error, a
  // timeout or a cancellation, that a full queue refused, or that were refused before they
  // reached an executor. `s` is stats().
  int64_t failed(const ExecutorStats& s) const {
    return s.errors + s.timeouts + s.queue_timeouts + s.cancelled + s.rejected + refused.load();
  }

 private:
  std::string name_;
  int64_t version_;
  ModelSettings settings_;
  std::string prompt_template_;
  std::vector<std::unique_ptr<Instance>> instances_;
  std::atomic<uint64_t> next_{0};
};

enum class ModelState { kReady, kUnavailable, kLoading, kUnloading };
const char* state_name(ModelState s);  // Triton's: READY, UNAVAILABLE, LOADING, UNLOADING

struct IndexEntry {
  std::string name;
  std::string version;  // "" when no version could be resolved
  ModelState state = ModelState::kUnavailable;
  std::string reason;
};

struct ManagerOptions {
  std::string repository;  // empty: models only from add_plan()
  bool explicit_control = false;
  int threads = 0;  // per instance; 0: this machine's hardware threads / instances
  LogLevel log_level = LogLevel::kWarning;
};

class ModelManager {
 public:
  ModelManager(ManagerOptions options, const Logger& log);
  ~ModelManager();

  // Mode none: every model of the repository (failures are logged and kept in the index).
  void load_all();
  // Loads (or reloads) a repository model; throws ServerError (kNotFound, kBadRequest for a bad
  // config/plan) naming the reason, which also goes to the index.
  void load(const std::string& name);
  void unload(const std::string& name);
  // The quick path: one model from a plan file, version 1.
  void add_plan(const std::string& plan_path, ModelSettings settings);

  // A ready model: `version` "" is the newest loaded. Throws ServerError kNotFound (unknown
  // model or version) or kUnavailable (known, not ready, with the reason).
  std::shared_ptr<LoadedModel> get(const std::string& name, const std::string& version = "") const;
  std::vector<std::shared_ptr<LoadedModel>> ready_models() const;
  std::vector<IndexEntry> index(bool ready_only = false) const;
  // Whether every model that should be loaded is (Triton's server readiness): false until
  // startup_done() (the HTTP port listens while the first models load).
  bool all_ready() const;
  // The models given at start (repository, --load-model, --plan) have been loaded or failed.
  void startup_done() { started_ = true; }
  bool explicit_control() const { return options_.explicit_control; }
  // Drains every model (SIGTERM): returns whether all in-flight requests finished in time.
  bool drain(Clock::time_point until);
  // Called on an engine thread for every finished request of every model loaded from now on
  // (the request log). Set before loading.
  using RequestObserver =
      std::function<void(const std::string& model, int64_t version, const RequestRecord& record)>;
  void set_request_observer(RequestObserver observer) { observer_ = std::move(observer); }

 private:
  std::shared_ptr<LoadedModel> load_version(const RepositoryModel& m, int64_t version,
                                            const std::string& plan_path);

  ManagerOptions options_;
  const Logger& log_;
  RequestObserver observer_;
  std::atomic<bool> started_{false};
  mutable std::mutex mutex_;
  struct Entry {
    std::map<int64_t, std::shared_ptr<LoadedModel>> versions;  // loaded
    ModelState state = ModelState::kUnavailable;
    std::string reason;
  };
  std::map<std::string, Entry> models_;
};

}  // namespace kiln::server
