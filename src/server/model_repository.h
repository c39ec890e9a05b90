// The model repository: Triton's layout, <repo>/<model>/config.pbtxt and
// <repo>/<model>/<version>/model.plan. config.pbtxt is protobuf text format, parsed with
// libprotobuf's TextFormat against proto/model_config.proto (Triton's names and numbers for the
// fields kiln uses); fields kiln does not use are skipped with one warning each.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/logging.h"
#include "model_config.pb.h"

namespace kiln::server {

// What kiln takes from a config.pbtxt (or from flags, for `kiln serve --plan`).
struct ModelSettings {
  std::string name;
  // Sequences stepped together; 0: the plan's profile (Triton's max_batch_size).
  int max_batch_size = 0;
  int instance_count = 1;
  // Requests waiting beyond the running ones (-1: no limit; Triton's max_queue_size 0).
  int64_t max_queue_size = -1;
  int64_t queue_timeout_us = 0;    // default_queue_policy.default_timeout_microseconds
  int64_t batch_delay_us = 0;      // dynamic_batching.max_queue_delay_microseconds
  int64_t request_timeout_us = 0;  // parameters.request_timeout_microseconds
  std::string input_name = "text_input";
  std::string output_name = "text_output";
  bool has_prompt_template = false;
  std::string prompt_template;     // parameters.prompt_template; else the plan's
  int64_t default_max_tokens = 0;  // parameters.default_max_tokens; 0: the model's default
  int64_t kv_budget_blocks = 0;    // parameters.kv_budget_blocks; 0: no limit
  int64_t max_step_tokens = 0;     // parameters.max_step_tokens; 0: the plan's profile
  std::string plan_filename = "model.plan";
  inference::ModelConfig config;  // as read, with the defaults filled in (for /config)
};

// One model directory of the repository, read: the versions its policy selects (newest first)
// and the settings, or the reason it cannot be served.
struct RepositoryModel {
  std::string name;
  std::string dir;
  std::vector<int64_t> versions;
  ModelSettings settings;
  std::string error;  // non-empty: not loadable (bad config, no version, no plan)
  std::string plan_path(int64_t version) const;
};

// Model names are directory names: non-empty, at most 128 bytes of [A-Za-z0-9_.-], not "." or
// "..", so that no name escapes the repository.
bool valid_model_name(const std::string& name);

// Every name RequestParams::set (generation_service.h) takes, aliases included: the request
// parameters of every protocol, and the optional parameter inputs beside the prompt in
// config.pbtxt and in infer requests (Triton's TensorRT-LLM models take them as tensors).
const std::vector<std::string>& request_parameter_names();
bool is_request_parameter(const std::string& name);

// The model directories of the repository (names sorted). Throws when `repo` is not a
// directory.
std::vector<std::string> list_repository(const std::string& repo);

// Reads <repo>/<name>: parses config.pbtxt (a missing one gets the defaults), checks it and
// resolves the version policy. Never throws for a bad model: the reason goes to `error`.
RepositoryModel read_repository_model(const std::string& repo, const std::string& name,
                                      const Logger& log);

// Parses config.pbtxt text into settings; throws a usage Error naming the field. Unknown fields
// are warned about through `log` (one warning each) and skipped.
ModelSettings parse_model_config(const std::string& text, const std::string& origin,
                                 const Logger& log);

}  // namespace kiln::server
