// Generation for run and eval: every prompt checked up front, then the scheduler's iteration-level
// batching, results handed over in prompt order as soon as they are ready.
#include <chrono>
#include <map>

#include "commands.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace kiln::cli {

std::string decode_ids(const Tokenizer& tok, const std::vector<int64_t>& ids,
                       const std::string& origin, const Logger& log) {
  // The model's vocabulary is often padded beyond the tokenizer's (T5: 288 vs 260); HF's decode
  // leaves ids it has no token for out of the text, and so does Tokenizer::decode. Say so.
  std::vector<int64_t> unknown;
  for (int64_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) unknown.push_back(id);
  if (!unknown.empty())
    log.warn(
        "{}: id(s) {} have no token in the tokenizer (ids 0..{}); they are left out of the "
        "text, as HuggingFace's decode does",
        origin, fmt::join(unknown, ", "), tok.vocab_size() - 1);
  return tok.decode(ids);
}

namespace {

std::string prompt_template_for(CompiledModel& engine, const GenerationFlags& flags,
                                const std::string& model_dir) {
  if (!flags.prompt_template.empty()) {
    KILN_CHECK_USAGE(flags.prompt_template.find("{prompt}") != std::string::npos,
                     "--prompt-template '{}': the template must contain {{prompt}} (where the "
                     "prompt goes), e.g. \"{{prompt}} =\"",
                     flags.prompt_template);
    return flags.prompt_template;
  }
  const std::string& templ = engine.model().prompt_template;
  if (!model_dir.empty() && !engine.desc().encoder_decoder && templ == "{prompt}")
    engine.context().log().warn(
        "--model {}: a decoder-only ({}) checkpoint without --prompt-template gets each prompt "
        "as given; if it was trained with a template, pass it (the bundled bloom-tiny needs "
        "--prompt-template \"{{prompt}} =\"), or build a plan with it",
        model_dir, engine.desc().architecture);
  return templ;
}

}  // namespace

std::vector<Generated> generate_all(CompiledModel& engine, const std::vector<TextInput>& prompts,
                                    const GenerationFlags& flags, const std::string& model_dir,
                                    const OnGenerated& on_generated) {
  const Logger& log = engine.context().log();
  const GenerationParams params = to_params(flags, engine.desc(), log);
  const std::string templ = prompt_template_for(engine, flags, model_dir);
  const Tokenizer& tok = engine.tokenizer();
  const int64_t limit = engine.model().profile.max_input_tokens;
  const size_t n = prompts.size();
  // Every prompt is checked before anything is generated, so that a bad one at the end of a
  // file does not cost the work before it (or print half the results).
  std::vector<Generated> out(n);
  for (size_t i = 0; i < n; ++i) {
    check_text(prompts[i], /*allow_empty=*/false);
    out[i].prompt = prompts[i].text;
    out[i].input_ids = tok.encode(apply_prompt_template(templ, prompts[i].text));
    const int64_t len = static_cast<int64_t>(out[i].input_ids.size());
    KILN_CHECK_USAGE(len <= limit,
                     "{}: the prompt is {} tokens{}; the {} allows at most {} (set at build "
                     "time with --max-input-tokens)",
                     prompts[i].origin, len, templ == "{prompt}" ? "" : " with its template",
                     model_dir.empty() ? "plan" : "model", limit);
  }
  // The scheduler owns the batching policy: every prompt is queued, and up to batch_size
  // sequences run together; a new one joins as soon as one finishes.
  SchedulerOptions so;
  so.max_batch =
      static_cast<int>(std::min<int64_t>(flags.batch_size, engine.model().profile.max_batch));
  Scheduler scheduler(engine, so);
  std::map<RequestId, size_t> index;
  const uint64_t seed = run_seed(flags, params, log);
  for (size_t i = 0; i < n; ++i) {
    GenerationParams request = params;
    request.seed = derive_seed(seed, i);
    try {
      index[scheduler.submit(out[i].input_ids, request)] = i;
    } catch (const Error& e) {
      throw Error(e.kind(), prompts[i].origin + ": " + e.what(), e.file(), e.line());
    }
  }
  Progress progress(log, "generating", static_cast<int64_t>(n), "prompts");
  std::vector<bool> finished(n, false);
  size_t done = 0, handed_over = 0;
  int64_t new_tokens = 0;
  while (done < n) {
    for (GenerationEvent& e : scheduler.step()) {
      if (!e.finished) continue;
      const size_t i = index.at(e.id);
      KILN_CHECK(e.error.empty(), "{}: {}", prompts[i].origin, e.error);
      Generated& g = out[i];
      g.result = std::move(e.result);
      g.text = decode_ids(tok, g.result.output_ids, prompts[i].origin, log);
      new_tokens += static_cast<int64_t>(g.result.output_ids.size());
      finished[i] = true;
      ++done;
      progress.advance();
    }
    for (; handed_over < n && finished[handed_over]; ++handed_over) {
      if (!on_generated) continue;
      const std::string note = on_generated(handed_over, out[handed_over], progress);
      if (!note.empty()) progress.set_note(note);
    }
  }
  const double secs = progress.elapsed_seconds();
  progress.done(
      fmt::format("{} prompts, {} decoding steps, {} new tokens in {:.2f} s ({:.1f} "
                  "tokens/s)",
                  n, scheduler.steps(), new_tokens, secs,
                  secs > 0 ? static_cast<double>(new_tokens) / secs : 0.0));
  return out;
}

}  // namespace kiln::cli
