// Loading models into instances, the repository index and the choice of an instance.
#include "server/model_manager.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <thread>

#include "server/errors.h"

namespace kiln::server {

// --- LoadedModel ---------------------------------------------------------------------------------

LoadedModel::LoadedModel(std::string name, int64_t version, ModelSettings settings,
                         std::vector<std::unique_ptr<Instance>> instances)
    : name_(std::move(name)),
      version_(version),
      settings_(std::move(settings)),
      instances_(std::move(instances)) {
  prompt_template_ =
      settings_.has_prompt_template ? settings_.prompt_template : model().model().prompt_template;
}

LoadedModel::~LoadedModel() {
  // Requests still running when the last holder lets go end cancelled (executor destructor).
  for (auto& i : instances_) i->executor.reset();
}

GenerationExecutor& LoadedModel::pick() {
  // Least loaded first; among equals, round-robin so that instances share a steady stream.
  const size_t n = instances_.size();
  const size_t start = static_cast<size_t>(next_.fetch_add(1) % n);
  size_t best = start;
  int64_t best_load = instances_[start]->executor->in_flight();
  for (size_t k = 1; k < n; ++k) {
    const size_t i = (start + k) % n;
    const int64_t load = instances_[i]->executor->in_flight();
    if (load < best_load) {
      best = i;
      best_load = load;
    }
  }
  return *instances_[best]->executor;
}

namespace {
void merge(Histogram& into, const Histogram& h) {
  if (into.buckets.size() != h.buckets.size()) {
    into = h;
    return;
  }
  for (size_t i = 0; i < h.buckets.size(); ++i) into.buckets[i] += h.buckets[i];
  into.sum += h.sum;
  into.count += h.count;
}
}  // namespace

ExecutorStats LoadedModel::stats() const {
  ExecutorStats total;
  bool first = true;
  for (const auto& i : instances_) {
    const ExecutorStats s = i->executor->stats();
    if (first) {
      total = s;
      first = false;
      continue;
    }
    total.pending += s.pending;
    total.running += s.running;
    total.kv_blocks_used += s.kv_blocks_used;
    total.kv_blocks_budget += s.kv_blocks_budget;
    total.kv_bytes_allocated += s.kv_bytes_allocated;
    total.steps += s.steps;
    total.preemptions += s.preemptions;
    total.steps_ahead += s.steps_ahead;
    total.encoder_steps += s.encoder_steps;
    for (auto [sum, part] : {std::pair{&total.decoder_launches, &s.decoder_launches},
                             std::pair{&total.encoder_launches, &s.encoder_launches}}) {
      sum->replayed += part->replayed;
      sum->captured += part->captured;
      sum->eager += part->eager;
      sum->capture_ms += part->capture_ms;
    }
    total.last_batch += s.last_batch;
    total.success += s.success;
    total.cancelled += s.cancelled;
    total.queue_timeouts += s.queue_timeouts;
    total.timeouts += s.timeouts;
    total.errors += s.errors;
    total.rejected += s.rejected;
    total.input_tokens += s.input_tokens;
    total.output_tokens += s.output_tokens;
    total.queue_us += s.queue_us;
    total.compute_us += s.compute_us;
    total.request_us += s.request_us;
    total.busy_us += s.busy_us;
    total.last_request = std::max(total.last_request, s.last_request);
    merge(total.ttft_seconds, s.ttft_seconds);
    merge(total.inter_token_seconds, s.inter_token_seconds);
    merge(total.output_tokens_per_request, s.output_tokens_per_request);
    merge(total.batch_size, s.batch_size);
  }
  return total;
}

int64_t LoadedModel::in_flight() const {
  int64_t n = 0;
  for (const auto& i : instances_) n += i->executor->in_flight();
  return n;
}

bool LoadedModel::drain(Clock::time_point until) {
  bool all = true;
  for (auto& i : instances_) all = i->executor->drain(until) && all;
  return all;
}

const char* state_name(ModelState s) {
  switch (s) {
    case ModelState::kReady:
      return "READY";
    case ModelState::kUnavailable:
      return "UNAVAILABLE";
    case ModelState::kLoading:
      return "LOADING";
    case ModelState::kUnloading:
      return "UNLOADING";
  }
  return "UNAVAILABLE";
}

// --- ModelManager --------------------------------------------------------------------------------

ModelManager::ModelManager(ManagerOptions options, const Logger& log)
    : options_(std::move(options)), log_(log) {}

ModelManager::~ModelManager() = default;

std::shared_ptr<LoadedModel> ModelManager::load_version(const RepositoryModel& m, int64_t version,
                                                        const std::string& plan_path) {
  const ModelSettings& s = m.settings;
  const Clock::time_point start = Clock::now();
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::unique_ptr<Instance>> instances;
  for (int i = 0; i < s.instance_count; ++i) {
    auto inst = std::make_unique<Instance>();
    ContextOptions co;
    co.log_level = options_.log_level;
    // Instances share the machine: each engine thread's pool gets its part of the cores.
    co.threads = options_.threads > 0 ? options_.threads : std::max(1, hw / s.instance_count);
    inst->ctx = std::make_unique<Context>(options_from_environment(co));
    inst->model = CompiledModel::load_plan(*inst->ctx, plan_path);
    const ModelIR& ir = inst->model->model();
    for (const inference::ModelInstanceGroup& g : s.config.instance_group()) {
      const bool gpu_plan = ir.device == Device::kCuda;
      if (g.kind() == inference::ModelInstanceGroup::KIND_GPU)
        KILN_CHECK_USAGE(gpu_plan,
                         "{}: instance_group kind KIND_GPU, but the plan {} was built for the "
                         "CPU (rebuild with `kiln build --device cuda`, or use KIND_CPU)",
                         m.name, plan_path);
      if (g.kind() == inference::ModelInstanceGroup::KIND_CPU)
        KILN_CHECK_USAGE(!gpu_plan,
                         "{}: instance_group kind KIND_CPU, but the plan {} was built for CUDA "
                         "(rebuild with `kiln build --device cpu`, or use KIND_GPU)",
                         m.name, plan_path);
    }
    ExecutorOptions eo;
    eo.name = fmt::format("{} v{}", m.name, version);
    const int64_t plan_batch = ir.profile.max_batch;
    if (s.max_batch_size > plan_batch)
      log_.warn(
          "{}: max_batch_size {} is more than the plan's profile allows ({}); using {} "
          "(rebuild with --max-batch to raise it)",
          m.name, s.max_batch_size, plan_batch, plan_batch);
    eo.scheduler.max_batch = static_cast<int>(
        s.max_batch_size > 0 ? std::min<int64_t>(s.max_batch_size, plan_batch) : plan_batch);
    eo.scheduler.kv_budget_blocks = s.kv_budget_blocks;
    if (s.max_step_tokens > 0)
      eo.scheduler.max_step_tokens = std::min(s.max_step_tokens, ir.profile.max_step_tokens);
    eo.max_queue = s.max_queue_size;
    eo.queue_timeout = std::chrono::microseconds(s.queue_timeout_us);
    eo.request_timeout = std::chrono::microseconds(s.request_timeout_us);
    eo.batch_delay = std::chrono::microseconds(s.batch_delay_us);
    inst->executor = std::make_unique<GenerationExecutor>(*inst->model, eo);
    if (observer_)
      inst->executor->set_observer([obs = observer_, name = m.name,
                                    version](const RequestRecord& r) { obs(name, version, r); });
    instances.push_back(std::move(inst));
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  log_.info("loaded {} version {} from {}: {} instance(s) in {:.0f} ms", m.name, version, plan_path,
            s.instance_count, ms);
  return std::make_shared<LoadedModel>(m.name, version, s, std::move(instances));
}

void ModelManager::load_all() {
  for (const std::string& name : list_repository(options_.repository)) {
    try {
      load(name);
    } catch (const std::exception& e) {
      log_.warn("model {} is not loaded: {}", name, e.what());
    }
  }
}

void ModelManager::load(const std::string& name) {
  if (!valid_model_name(name))
    KILN_SERVER_FAIL(Code::kBadRequest,
                     "model name \"{}\" is not valid (letters, digits, _ . - only)", name);
  KILN_CHECK_USAGE(!options_.repository.empty(),
                   "no model repository: this server serves --plan only");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& e = models_[name];
    e.state = ModelState::kLoading;
    e.reason.clear();
  }
  const RepositoryModel m = read_repository_model(options_.repository, name, log_);
  std::map<int64_t, std::shared_ptr<LoadedModel>> versions;
  std::string error = m.error;
  if (error.empty()) {
    for (int64_t v : m.versions) {
      try {
        versions[v] = load_version(m, v, m.plan_path(v));
      } catch (const std::exception& e) {
        error = fmt::format("version {}: {}", v, e.what());
        break;
      }
    }
  }
  std::map<int64_t, std::shared_ptr<LoadedModel>> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& e = models_[name];
    if (!error.empty()) {
      e.state = e.versions.empty() ? ModelState::kUnavailable : ModelState::kReady;
      e.reason = error;
      // A failed reload keeps serving what was loaded (Triton's behaviour).
    } else {
      old.swap(e.versions);
      e.versions = std::move(versions);
      e.state = ModelState::kReady;
      e.reason.clear();
    }
  }
  if (!error.empty()) {
    const bool missing = m.error.rfind("no model \"", 0) == 0;
    if (missing) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (models_[name].versions.empty()) models_.erase(name);
      KILN_SERVER_FAIL(Code::kNotFound, "{}", error);
    }
    KILN_SERVER_FAIL(Code::kBadRequest, "failed to load model {}: {}", name, error);
  }
  // `old` drains as its last holder lets go.
}

void ModelManager::unload(const std::string& name) {
  std::map<int64_t, std::shared_ptr<LoadedModel>> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = models_.find(name);
    if (it == models_.end() || it->second.state != ModelState::kReady)
      KILN_SERVER_FAIL(Code::kNotFound, "model \"{}\" is not loaded", name);
    old.swap(it->second.versions);
    it->second.state = ModelState::kUnavailable;
    it->second.reason = "unloaded";
  }
  log_.info("unloaded {}", name);
}

void ModelManager::add_plan(const std::string& plan_path, ModelSettings settings) {
  RepositoryModel m;
  m.name = settings.name;
  m.settings = std::move(settings);
  m.versions = {1};
  auto loaded = load_version(m, 1, plan_path);
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = models_[m.name];
  e.versions[1] = std::move(loaded);
  e.state = ModelState::kReady;
}

std::shared_ptr<LoadedModel> ModelManager::get(const std::string& name,
                                               const std::string& version) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    std::error_code ec;
    if (!options_.repository.empty() && valid_model_name(name) &&
        std::filesystem::is_directory(std::filesystem::path(options_.repository) / name, ec))
      KILN_SERVER_FAIL(Code::kUnavailable,
                       "model \"{}\" is in the repository but not loaded (load it: POST "
                       "/v2/repository/models/{}/load)",
                       name, name);
    KILN_SERVER_FAIL(Code::kNotFound, "unknown model \"{}\"", name);
  }
  const Entry& e = it->second;
  if (e.versions.empty())
    KILN_SERVER_FAIL(Code::kUnavailable, "model \"{}\" is not ready{}", name,
                     e.reason.empty() ? "" : ": " + e.reason);
  if (version.empty()) return e.versions.rbegin()->second;
  int64_t v = -1;
  try {
    size_t used = 0;
    v = std::stoll(version, &used);
    if (used != version.size()) v = -1;
  } catch (const std::exception&) {
    v = -1;
  }
  auto vt = v < 0 ? e.versions.end() : e.versions.find(v);
  if (vt == e.versions.end())
    KILN_SERVER_FAIL(Code::kNotFound, "model \"{}\" has no version \"{}\" loaded", name, version);
  return vt->second;
}

std::vector<std::shared_ptr<LoadedModel>> ModelManager::ready_models() const {
  std::vector<std::shared_ptr<LoadedModel>> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, e] : models_)
    for (const auto& [v, m] : e.versions) out.push_back(m);
  return out;
}

std::vector<IndexEntry> ModelManager::index(bool ready_only) const {
  std::vector<IndexEntry> out;
  std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, e] : models_) {
      seen.insert(name);
      if (e.versions.empty()) {
        if (!ready_only) out.push_back({name, "", e.state, e.reason});
        continue;
      }
      for (const auto& [v, m] : e.versions)
        out.push_back({name, std::to_string(v), ModelState::kReady, ""});
      if (!e.reason.empty() && !ready_only)
        out.push_back({name, "", ModelState::kUnavailable, e.reason});
    }
  }
  // Explicit mode: models of the repository not loaded yet are listed too (Triton does).
  if (!ready_only && !options_.repository.empty()) {
    try {
      for (const std::string& name : list_repository(options_.repository))
        if (seen.count(name) == 0) out.push_back({name, "", ModelState::kUnavailable, ""});
    } catch (const std::exception&) {
      // The repository went away: the loaded models still serve.
    }
  }
  return out;
}

bool ModelManager::all_ready() const {
  if (!started_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.explicit_control) return true;
  for (const auto& [name, e] : models_)
    if (e.versions.empty()) return false;
  return true;
}

bool ModelManager::drain(Clock::time_point until) {
  bool all = true;
  for (auto& m : ready_models()) all = m->drain(until) && all;
  return all;
}

}  // namespace kiln::server
