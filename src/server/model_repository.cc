// Reading the model repository: directory layout, config.pbtxt (protobuf text format) and the
// version policy.
#include "server/model_repository.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/status.h"

namespace fs = std::filesystem;

namespace kiln::server {

namespace {

// TextFormat's parser reports through this: errors become the usage Error's message, unknown
// fields (parsed with AllowUnknownField) one warning each.
class Collector : public google::protobuf::io::ErrorCollector {
 public:
  Collector(std::string origin, const Logger& log) : origin_(std::move(origin)), log_(log) {}
  void AddError(int line, int column, const std::string& message) override {
    if (error_.empty())
      error_ = fmt::format("{}:{}:{}: {}", origin_, line + 1, column + 1, message);
  }
  void AddWarning(int line, int column, const std::string& message) override {
    // Fields inside a Triton section kiln ignores as a whole: that section gets one warning.
    for (const char* ignored : {"ModelOptimizationPolicy", "ModelSequenceBatching",
                                "ModelEnsembling", "BatchInput", "BatchOutput", "ModelWarmup",
                                "ModelOperations", "ModelRepositoryAgents", "ModelResponseCache"})
      if (message.find(std::string("inference.") + ignored + "\"") != std::string::npos) return;
    log_.warn("{}:{}: {} (kiln does not use it; ignored)", origin_, line + 1, message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string origin_;
  const Logger& log_;
  std::string error_;
};

int64_t non_negative(const std::string& origin, const std::string& key, const std::string& value) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KILN_CHECK_USAGE(used == value.size() && v >= 0,
                   "{}: parameters \"{}\" must be a non-negative integer (string_value), got "
                   "\"{}\"",
                   origin, key, value);
  return v;
}

void check_text_tensor(const std::string& origin, const char* what, const std::string& name,
                       inference::DataType type) {
  KILN_CHECK_USAGE(type == inference::TYPE_STRING,
                   "{}: {} \"{}\" must be data_type TYPE_STRING (text; BYTES on the wire), got {}",
                   origin, what, name, inference::DataType_Name(type));
}

// Inputs the infer endpoints accept beside the prompt: generation parameters as tensors.

}  // namespace

const std::vector<std::string>& request_parameter_names() {
  static const std::vector<std::string> names{"max_tokens",
                                              "max_new_tokens",
                                              "min_tokens",
                                              "min_new_tokens",
                                              "temperature",
                                              "top_k",
                                              "top_p",
                                              "seed",
                                              "random_seed",
                                              "beam_width",
                                              "num_beams",
                                              "ignore_eos",
                                              "repetition_penalty",
                                              "length_penalty",
                                              "return_token_ids",
                                              "stop",
                                              "stop_words",
                                              "timeout"};
  return names;
}

bool is_request_parameter(const std::string& name) {
  const auto& names = request_parameter_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool valid_model_name(const std::string& name) {
  if (name.empty() || name.size() > 128 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

std::string RepositoryModel::plan_path(int64_t version) const {
  return (fs::path(dir) / std::to_string(version) / settings.plan_filename).string();
}

std::vector<std::string> list_repository(const std::string& repo) {
  std::error_code ec;
  KILN_CHECK(fs::is_directory(repo, ec), "--model-repository {}: not a directory", repo);
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(repo, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec) && !name.starts_with(".")) names.push_back(name);
  }
  KILN_CHECK(!ec, "--model-repository {}: {}", repo, ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

ModelSettings parse_model_config(const std::string& text, const std::string& origin,
                                 const Logger& log) {
  ModelSettings s;
  google::protobuf::TextFormat::Parser parser;
  Collector collector(origin, log);
  parser.RecordErrorsTo(&collector);
  parser.AllowUnknownField(true);
  const bool ok = parser.ParseFromString(text, &s.config);
  KILN_CHECK_USAGE(
      ok, "{}",
      collector.error().empty() ? origin + ": not a valid config.pbtxt" : collector.error());
  inference::ModelConfig& c = s.config;
  // Triton sections kiln has no use for: accepted, one warning each.
  const auto* desc = c.GetDescriptor();
  const auto* refl = c.GetReflection();
  for (const char* field :
       {"optimization", "sequence_batching", "ensemble_scheduling", "model_warmup",
        "model_operations", "batch_input", "batch_output", "model_repository_agents",
        "response_cache", "cc_model_filenames", "metric_tags", "runtime"}) {
    const auto* f = desc->FindFieldByName(field);
    const bool set = f->is_repeated() ? refl->FieldSize(c, f) > 0 : refl->HasField(c, f);
    if (set) log.warn("{}: {} is not used by kiln; ignored", origin, field);
  }
  KILN_CHECK_USAGE(!c.has_sequence_batching() && !c.has_ensemble_scheduling(),
                   "{}: {} is not supported: kiln serves one plan per model with continuous "
                   "batching (use dynamic_batching or nothing)",
                   origin, c.has_sequence_batching() ? "sequence_batching" : "ensemble_scheduling");
  KILN_CHECK_USAGE(c.platform().empty() || c.platform() == "kiln_plan",
                   "{}: platform \"{}\" is not kiln's; kiln serves platform \"kiln_plan\" (or "
                   "backend \"kiln\"): build a plan with `kiln build` and set platform: "
                   "\"kiln_plan\"",
                   origin, c.platform());
  KILN_CHECK_USAGE(c.backend().empty() || c.backend() == "kiln",
                   "{}: backend \"{}\" is not kiln's; use backend: \"kiln\" (or platform: "
                   "\"kiln_plan\")",
                   origin, c.backend());
  if (c.platform().empty() && c.backend().empty()) c.set_platform("kiln_plan");
  KILN_CHECK_USAGE(c.max_batch_size() >= 0, "{}: max_batch_size must be >= 0, got {}", origin,
                   c.max_batch_size());
  s.max_batch_size = c.max_batch_size();
  // Inputs: one text input (the prompt), optionally generation parameters as tensors.
  int text_inputs = 0;
  for (const inference::ModelInput& in : c.input()) {
    if (is_request_parameter(in.name())) continue;
    check_text_tensor(origin, "input", in.name(), in.data_type());
    s.input_name = in.name();
    ++text_inputs;
  }
  KILN_CHECK_USAGE(text_inputs <= 1,
                   "{}: {} text inputs; kiln's models take one (the prompt), plus optional "
                   "parameter inputs ({})",
                   origin, text_inputs, fmt::join(request_parameter_names(), ", "));
  KILN_CHECK_USAGE(c.output_size() <= 2, "{}: {} outputs; kiln gives text_output (and token_ids)",
                   origin, c.output_size());
  for (const inference::ModelOutput& out : c.output()) {
    if (out.name() == "token_ids") continue;
    check_text_tensor(origin, "output", out.name(), out.data_type());
    s.output_name = out.name();
  }
  if (c.input_size() == 0) {
    inference::ModelInput* in = c.add_input();
    in->set_name(s.input_name);
    in->set_data_type(inference::TYPE_STRING);
    in->add_dims(1);
  }
  if (c.output_size() == 0) {
    inference::ModelOutput* out = c.add_output();
    out->set_name(s.output_name);
    out->set_data_type(inference::TYPE_STRING);
    out->add_dims(-1);
  }
  // Instances: counted over the groups; the kind is checked against the plan's device on load.
  if (c.instance_group_size() > 0) {
    s.instance_count = 0;
    for (const inference::ModelInstanceGroup& g : c.instance_group()) {
      const int count = g.count() == 0 ? 1 : g.count();  // Triton: count defaults to 1
      KILN_CHECK_USAGE(count >= 1 && count <= 16, "{}: instance_group count must be 1..16, got {}",
                       origin, g.count());
      s.instance_count += count;
    }
    KILN_CHECK_USAGE(s.instance_count <= 16, "{}: {} instances in all; at most 16", origin,
                     s.instance_count);
  }
  if (c.has_dynamic_batching()) {
    const inference::ModelDynamicBatching& d = c.dynamic_batching();
    s.batch_delay_us = static_cast<int64_t>(d.max_queue_delay_microseconds());
    KILN_CHECK_USAGE(s.batch_delay_us <= 10'000'000,
                     "{}: max_queue_delay_microseconds {} is over 10 s", origin, s.batch_delay_us);
    if (d.preferred_batch_size_size() > 0)
      log.warn(
          "{}: dynamic_batching.preferred_batch_size is ignored: kiln batches continuously "
          "(requests join the running batch at every step)",
          origin);
    if (d.has_default_queue_policy()) {
      const inference::ModelQueuePolicy& q = d.default_queue_policy();
      if (q.max_queue_size() > 0) s.max_queue_size = q.max_queue_size();
      s.queue_timeout_us = static_cast<int64_t>(q.default_timeout_microseconds());
      KILN_CHECK_USAGE(q.timeout_action() == inference::ModelQueuePolicy::REJECT,
                       "{}: default_queue_policy.timeout_action DELAY is not supported; kiln "
                       "rejects requests that time out in the queue (REJECT)",
                       origin);
    }
  }
  for (const auto& [key, value] : c.parameters()) {
    const std::string& v = value.string_value();
    if (key == "prompt_template") {
      KILN_CHECK_USAGE(v.find("{prompt}") != std::string::npos,
                       "{}: parameters \"prompt_template\" must contain {{prompt}}, got \"{}\"",
                       origin, v);
      s.has_prompt_template = true;
      s.prompt_template = v;
    } else if (key == "default_max_tokens") {
      s.default_max_tokens = non_negative(origin, key, v);
    } else if (key == "kv_budget_blocks") {
      s.kv_budget_blocks = non_negative(origin, key, v);
    } else if (key == "max_step_tokens") {
      s.max_step_tokens = non_negative(origin, key, v);
    } else if (key == "request_timeout_microseconds") {
      s.request_timeout_us = non_negative(origin, key, v);
    } else {
      log.warn(
          "{}: parameters \"{}\" is not one of kiln's (prompt_template, default_max_tokens, "
          "kv_budget_blocks, max_step_tokens, request_timeout_microseconds); ignored",
          origin, key);
    }
  }
  if (!c.default_model_filename().empty()) {
    const std::string& f = c.default_model_filename();
    KILN_CHECK_USAGE(f.find('/') == std::string::npos && f != ".." && f != ".",
                     "{}: default_model_filename \"{}\" must be a file name", origin, f);
    s.plan_filename = f;
  }
  s.name = c.name();
  return s;
}

RepositoryModel read_repository_model(const std::string& repo, const std::string& name,
                                      const Logger& log) {
  RepositoryModel m;
  m.name = name;
  m.dir = (fs::path(repo) / name).string();
  try {
    KILN_CHECK_USAGE(valid_model_name(name),
                     "model name \"{}\" is not a directory name of the repository (letters, "
                     "digits, _ . -)",
                     name);
    std::error_code ec;
    if (!fs::is_directory(m.dir, ec))
      throw Error(ErrorKind::kNotFound,
                  fmt::format("no model \"{}\" in the repository {}", name, repo), __FILE__,
                  __LINE__);
    const fs::path config = fs::path(m.dir) / "config.pbtxt";
    if (fs::exists(config, ec)) {
      std::ifstream in(config);
      std::stringstream text;
      text << in.rdbuf();
      KILN_CHECK(in.good() || in.eof(), "{}: cannot read", config.string());
      m.settings = parse_model_config(text.str(), config.string(), log);
    } else {
      m.settings = parse_model_config("", config.string() + " (absent: defaults)", log);
    }
    KILN_CHECK_USAGE(m.settings.name.empty() || m.settings.name == name,
                     "{}: name \"{}\" differs from the model's directory name \"{}\"",
                     config.string(), m.settings.name, name);
    m.settings.name = name;
    m.settings.config.set_name(name);
    // Versions: numeric subdirectories holding the plan file.
    std::vector<int64_t> found;
    for (const fs::directory_entry& e : fs::directory_iterator(m.dir, ec)) {
      const std::string v = e.path().filename().string();
      if (!e.is_directory(ec) || v.empty() || v.size() > 18 ||
          !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
        continue;
      found.push_back(std::stoll(v));
    }
    std::sort(found.rbegin(), found.rend());
    KILN_CHECK(!found.empty(),
               "{}: no version directory (the plan goes in {}/1/{}; build it with `kiln build "
               "... -o {}/1/{}`)",
               m.dir, m.dir, m.settings.plan_filename, m.dir, m.settings.plan_filename);
    const inference::ModelVersionPolicy& p = m.settings.config.version_policy();
    if (p.has_all()) {
      m.versions = found;
    } else if (p.has_specific()) {
      for (int64_t v : p.specific().versions()) {
        KILN_CHECK(std::find(found.begin(), found.end(), v) != found.end(),
                   "{}: version_policy specific names version {}, which has no directory", m.dir,
                   v);
        m.versions.push_back(v);
      }
      std::sort(m.versions.rbegin(), m.versions.rend());
    } else {
      const size_t n =
          p.has_latest() && p.latest().num_versions() > 0 ? p.latest().num_versions() : 1;
      m.versions.assign(found.begin(), found.begin() + std::min(n, found.size()));
    }
    for (int64_t v : m.versions)
      KILN_CHECK(fs::is_regular_file(m.plan_path(v), ec),
                 "{}: no plan file (build one with `kiln build ... -o {}`)", m.plan_path(v),
                 m.plan_path(v));
  } catch (const std::exception& e) {
    m.error = e.what();
  }
  return m;
}

}  // namespace kiln::server
