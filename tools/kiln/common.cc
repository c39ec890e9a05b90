#include <unistd.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "io/jsonl.h"
#include "runtime/scheduler.h"

namespace kiln::cli {

std::unique_ptr<Context> make_context(const GlobalOptions& g) {
  ContextOptions o;
  o.threads = g.threads;
  o.log_level = g.verbose ? LogLevel::kInfo : (g.quiet ? LogLevel::kError : LogLevel::kWarning);
  o = options_from_environment(o);
  if (g.verbose) o.log_level = LogLevel::kInfo;
  return std::make_unique<Context>(o);
}

std::unique_ptr<CompiledModel> open_engine(Context& ctx, const std::string& plan,
                                           const std::string& model) {
  KILN_CHECK_USAGE(plan.empty() != model.empty(), "give exactly one of --plan or --model");
  if (!plan.empty()) return CompiledModel::load_plan(ctx, plan);
  return compile_model_dir(ctx, model);
}

bool GenerationFlags::was_given(const std::string& flag) const {
  for (const auto& [name, opt] : given)
    if (name == flag) return opt->count() > 0;
  return false;
}

std::vector<std::string> read_prompt_lines(const std::string& path) {
  std::vector<std::string> out;
  read_jsonl(path, [&](const nlohmann::json& j, int line) {
    if (j.is_string()) {
      out.push_back(j.get<std::string>());
    } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      out.push_back(j["text"].get<std::string>());
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      out.push_back(j["prompt"].get<std::string>());
    } else {
      KILN_FAIL_KIND(ErrorKind::kUsage,
                     "{}:{}: expected a JSON string or an object with a \"text\" or \"prompt\" "
                     "string",
                     path, line);
    }
  });
  return out;
}

void add_generation_flags(CLI::App& cmd, GenerationFlags& f) {
  auto track = [&](const char* name, CLI::Option* opt) { f.given.emplace_back(name, opt); };
  track("--max-new-tokens",
        cmd.add_option("--max-new-tokens", f.max_new_tokens,
                       "most tokens to generate per prompt (default: the model's "
                       "generation_config, else this)")
            ->capture_default_str());
  track("--beams", cmd.add_option("--beams", f.beams,
                                  "beam search width (1: greedy or sampling; default: the model's)")
                       ->capture_default_str());
  track("--length-penalty", cmd.add_option("--length-penalty", f.length_penalty,
                                           "beam score = log p / length^penalty (HF semantics)")
                                ->capture_default_str());
  track("--early-stopping",
        cmd.add_option("--early-stopping", f.early_stopping,
                       "when beam search stops, in HF's spelling: false (once no running beam can "
                       "beat the finished ones at its current length), true (once --beams "
                       "hypotheses finished), never (once no running beam can beat them at any "
                       "length); default: the model's, else false")
            ->check(CLI::IsMember({"false", "true", "never"})));
  track("--temperature",
        cmd.add_option("--temperature", f.temperature, "sample with this temperature (0: greedy)")
            ->capture_default_str());
  track("--top-k", cmd.add_option("--top-k", f.top_k,
                                  "sample only from the k most likely tokens (0: off; HF default "
                                  "50)"));
  track("--top-p",
        cmd.add_option("--top-p", f.top_p, "sample from the smallest set with this mass (1: off)")
            ->capture_default_str());
  track("--seed", cmd.add_option("--seed", f.seed, "sampling seed (same seed, same output)")
                      ->capture_default_str());
  cmd.add_option("--batch-size", f.batch_size, "prompts generated together")->capture_default_str();
  cmd.add_option("--prompt-template", f.prompt_template,
                 "wrap each prompt, e.g. \"{prompt} =\" (default: the plan's)");
}

GenerationParams to_params(const GenerationFlags& f, const ModelDesc& desc) {
  GenerationParams p = default_generation_params(desc);
  const bool model_sets_length = desc.generation.max_new_tokens || desc.generation.max_length;
  if (f.was_given("--max-new-tokens") || !model_sets_length) {
    p.max_new_tokens = f.max_new_tokens;
    p.max_length = 0;
  }
  if (f.was_given("--beams")) p.num_beams = f.beams;
  if (f.was_given("--length-penalty")) p.length_penalty = f.length_penalty;
  if (f.was_given("--early-stopping")) {
    KILN_CHECK_USAGE(
        f.early_stopping == "false" || f.early_stopping == "true" || f.early_stopping == "never",
        "--early-stopping must be false, true or never, got '{}'", f.early_stopping);
    p.early_stopping = f.early_stopping == "true"    ? EarlyStopping::kAlways
                       : f.early_stopping == "never" ? EarlyStopping::kNever
                                                     : EarlyStopping::kHeuristic;
  }
  if (f.was_given("--temperature")) {
    KILN_CHECK_USAGE(f.temperature >= 0.0f, "--temperature must be >= 0, got {}", f.temperature);
    p.do_sample = f.temperature > 0.0f;
    if (p.do_sample) p.temperature = f.temperature;
  }
  if (f.was_given("--top-k")) p.top_k = f.top_k;
  if (f.was_given("--top-p")) p.top_p = f.top_p;
  if (f.was_given("--seed")) p.seed = f.seed;
  KILN_CHECK_USAGE(f.batch_size >= 1 && f.batch_size <= 1024, "--batch-size must be in 1..1024");
  validate(p);
  return p;
}

std::vector<Generated> generate_all(CompiledModel& engine, const std::vector<std::string>& prompts,
                                    const GenerationFlags& flags, bool show_progress) {
  const GenerationParams params = to_params(flags, engine.desc());
  std::string templ =
      flags.prompt_template.empty() ? engine.model().prompt_template : flags.prompt_template;
  check_prompt_template(templ);
  std::vector<Generated> out(prompts.size());
  std::vector<std::vector<int64_t>> ids(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    out[i].prompt = prompts[i];
    KILN_CHECK_USAGE(!prompts[i].empty(), "prompt {} is empty", i + 1);
    ids[i] = engine.tokenizer().encode(apply_prompt_template(templ, prompts[i]));
    out[i].input_ids = ids[i];
  }
  // The scheduler owns the batching policy: every prompt is queued, and up to batch_size
  // sequences run together; a new one joins as soon as one finishes.
  SchedulerOptions so;
  so.max_batch =
      static_cast<int>(std::min<int64_t>(flags.batch_size, engine.model().profile.max_batch));
  Scheduler scheduler(engine, so);
  Progress progress(engine.context().log(), "generating", static_cast<int64_t>(prompts.size()));
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[scheduler.submit(ids[i], params)] = i;
  size_t done = 0;
  while (done < prompts.size()) {
    for (GenerationEvent& e : scheduler.step()) {
      if (!e.finished) continue;
      const size_t i = index.at(e.id);
      KILN_CHECK(e.error.empty(), "prompt {}: {}", i + 1, e.error);
      Generated& g = out[i];
      g.result = std::move(e.result);
      g.text = engine.tokenizer().decode(g.result.output_ids);
      ++done;
      if (show_progress) progress.advance();
    }
  }
  if (show_progress) progress.done();
  return out;
}

}  // namespace kiln::cli
