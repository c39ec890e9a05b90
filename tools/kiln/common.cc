#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "runtime/generator.h"

namespace kiln::cli {

std::unique_ptr<Context> make_context(const GlobalOptions& g) {
  ContextOptions o;
  o.threads = g.threads;
  o.log_level = g.verbose ? LogLevel::kInfo : (g.quiet ? LogLevel::kError : LogLevel::kWarning);
  o = options_from_environment(o);
  if (g.verbose) o.log_level = LogLevel::kInfo;
  return std::make_unique<Context>(o);
}

std::unique_ptr<Engine> open_engine(Context& ctx, const std::string& plan,
                                    const std::string& model) {
  KILN_CHECK_USAGE(plan.empty() != model.empty(), "give exactly one of --plan or --model");
  if (!plan.empty()) return Engine::from_plan(ctx, plan);
  return Engine::from_model_dir(ctx, model);
}

std::vector<std::string> read_prompt_lines(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK_USAGE(in.good(), "cannot open input file '{}'", path);
  std::vector<std::string> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      KILN_FAIL_KIND(ErrorKind::kUsage, "{}:{}: not valid JSON: {}", path, lineno, e.what());
    }
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
                     path, lineno);
    }
  }
  return out;
}

void add_generation_flags(CLI::App& cmd, GenerationFlags& f) {
  cmd.add_option("--max-new-tokens", f.max_new_tokens, "most tokens to generate per prompt")
      ->capture_default_str();
  cmd.add_option("--beams", f.beams, "beam search width (1: greedy or sampling)")
      ->capture_default_str();
  cmd.add_option("--length-penalty", f.length_penalty,
                 "beam score = log p / length^penalty (HF semantics)")
      ->capture_default_str();
  cmd.add_option("--temperature", f.temperature, "sample with this temperature (0: greedy)")
      ->capture_default_str();
  cmd.add_option("--top-k", f.top_k, "sample only from the k most likely tokens (0: off)")
      ->capture_default_str();
  cmd.add_option("--top-p", f.top_p, "sample from the smallest set with this mass (1: off)")
      ->capture_default_str();
  cmd.add_option("--seed", f.seed, "sampling seed (same seed, same output)")->capture_default_str();
  cmd.add_option("--batch-size", f.batch_size, "prompts generated together")->capture_default_str();
  cmd.add_option("--prompt-template", f.prompt_template,
                 "wrap each prompt, e.g. \"{prompt} =\" (default: the plan's)");
}

GenerationParams to_params(const GenerationFlags& f) {
  GenerationParams p;
  p.max_new_tokens = f.max_new_tokens;
  p.num_beams = f.beams;
  p.length_penalty = f.length_penalty;
  KILN_CHECK_USAGE(f.temperature >= 0.0f, "--temperature must be >= 0, got {}", f.temperature);
  p.do_sample = f.temperature > 0.0f;
  p.temperature = f.temperature > 0.0f ? f.temperature : 1.0f;
  p.top_k = f.top_k;
  p.top_p = f.top_p;
  p.seed = f.seed;
  KILN_CHECK_USAGE(f.batch_size >= 1 && f.batch_size <= 1024, "--batch-size must be in 1..1024");
  validate(p);
  return p;
}

std::vector<Generated> generate_all(Engine& engine, const std::vector<std::string>& prompts,
                                    const GenerationFlags& flags, bool show_progress) {
  const GenerationParams params = to_params(flags);
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
  Generator gen(engine);
  Progress progress(engine.context().log(), "generating", static_cast<int64_t>(prompts.size()));
  // Keep up to batch_size requests in flight; a new one joins as soon as one finishes.
  std::map<Generator::RequestId, size_t> index;
  size_t next = 0, done = 0;
  while (done < prompts.size()) {
    while (next < prompts.size() && next - done < static_cast<size_t>(flags.batch_size)) {
      index[gen.submit(ids[next], params)] = next;
      ++next;
    }
    gen.step();
    for (auto& [id, res] : gen.take_finished()) {
      Generated& g = out[index.at(id)];
      g.result = std::move(res);
      g.text = engine.tokenizer().decode(g.result.output_ids);
      ++done;
      if (show_progress) progress.advance();
    }
  }
  if (show_progress) progress.done();
  return out;
}

}  // namespace kiln::cli
