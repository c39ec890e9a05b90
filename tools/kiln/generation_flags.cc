// The generation flags of run and eval: HF's generate() settings, over the model's
// generation_config defaults, and the seeds of sampled requests.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace kiln::cli {
namespace {

// A flag's JSON value: a list of token ids ("[3, 7]", or one id where `one_id_ok`), or a list
// of such lists ("[[3, 7], [9]]").
std::vector<int64_t> parse_id_list(const nlohmann::json& v, const char* flag, bool one_id_ok) {
  std::vector<int64_t> ids;
  if (one_id_ok && v.is_number_integer()) return {v.get<int64_t>()};
  KILN_CHECK_USAGE(v.is_array(), "{}: expected a JSON list of token ids such as [3, 7], got {}",
                   flag, v.dump());
  for (const nlohmann::json& id : v) {
    KILN_CHECK_USAGE(id.is_number_integer() && id.get<int64_t>() >= 0,
                     "{}: token ids are integers >= 0, got {}", flag, id.dump());
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

nlohmann::json parse_flag_json(const std::string& text, const char* flag) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    KILN_FAIL_KIND(
        ::kiln::ErrorKind::kUsage, "{}: '{}' is not JSON; give token ids as a JSON list, e.g. {}",
        flag, text,
        std::string_view(flag) == "--bad-words-ids" ? "\"[[12, 7], [9]]\"" : "\"[3, 7]\"");
  }
}

}  // namespace

bool GenerationFlags::was_given(const std::string& flag) const {
  for (const auto& [name, opt] : given)
    if (name == flag) return opt->count() > 0;
  return false;
}

void add_generation_flags(CLI::App& cmd, GenerationFlags& f) {
  auto track = [&](const char* name, CLI::Option* opt) { f.given.emplace_back(name, opt); };
  const int64_t kNoLimit = std::numeric_limits<int64_t>::max();
  track("--max-new-tokens",
        in_range(cmd.add_option("--max-new-tokens", f.max_new_tokens,
                                "most tokens to generate per prompt (default: the model's "
                                "generation_config, else this)")
                     ->capture_default_str(),
                 1, kMaxNewTokensLimit));
  track("--min-new-tokens",
        in_range(cmd.add_option("--min-new-tokens", f.min_new_tokens,
                                "EOS is not generated before this many new tokens"),
                 0, kMaxNewTokensLimit));
  track("--min-length",
        in_range(cmd.add_option("--min-length", f.min_length,
                                "HF's min_length: EOS is not generated while the sequence (the "
                                "prompt and the new tokens; T5: the decoder's tokens) is shorter"),
                 0, kNoLimit));
  track("--beams", in_range(cmd.add_option("--beams", f.beams,
                                           "beam search width (1: greedy or sampling; default: "
                                           "the model's)")
                                ->capture_default_str(),
                            1, kMaxBeams));
  track("--length-penalty",
        cmd.add_option("--length-penalty", f.length_penalty,
                       "with --beams: beam score = log p / length^penalty (HF semantics)")
            ->capture_default_str()
            ->check(number_check([](double v) { return std::isfinite(v); }, "a finite number")));
  track("--early-stopping",
        cmd.add_option("--early-stopping", f.early_stopping,
                       "with --beams: when beam search stops, in HF's spelling: false (once no "
                       "running beam can beat the finished ones at its current length), true "
                       "(once --beams hypotheses finished), never (once no running beam can beat "
                       "them at any length); default: the model's, else false")
            ->check(CLI::IsMember({"false", "true", "never"})));
  track("--temperature", cmd.add_option("--temperature", f.temperature,
                                        "sample with this temperature (0: greedy, the default)")
                             ->check(number_check([](double v) { return v >= 0.0 && v <= 100.0; },
                                                  "a number in 0..100")));
  track("--top-k", cmd.add_option("--top-k", f.top_k,
                                  "when sampling: only the k most likely tokens (0: off; HF's "
                                  "default when sampling: 50)")
                       ->check(int_check(0, kNoLimit)));
  track("--top-p", cmd.add_option("--top-p", f.top_p,
                                  "when sampling: the smallest set of tokens with this mass (1: "
                                  "off)")
                       ->check(number_check([](double v) { return v > 0.0 && v <= 1.0; },
                                            "a number in (0, 1]")));
  track("--seed", cmd.add_option("--seed", f.seed,
                                 "when sampling: the run's random seed; each prompt samples from "
                                 "its own stream derived from it and its position, so identical "
                                 "prompts differ and the same seed repeats the run exactly "
                                 "(default: a new seed each run, printed with -v)")
                      ->check(int_check(0, kNoLimit)));
  track("--repetition-penalty",
        cmd.add_option("--repetition-penalty", f.repetition_penalty,
                       "HF's repetition_penalty: a token already in the sequence has its logit "
                       "divided by this (multiplied where negative); > 1 discourages repeats")
            ->check(number_check([](double v) { return v > 0.0 && v <= 1e6; }, "a number > 0")));
  track("--no-repeat-ngram-size",
        in_range(cmd.add_option("--no-repeat-ngram-size", f.no_repeat_ngram_size,
                                "no n-gram of this size occurs twice in the sequence (0: off)"),
                 0, 1 << 20));
  track("--encoder-no-repeat-ngram-size",
        in_range(cmd.add_option("--encoder-no-repeat-ngram-size", f.encoder_no_repeat_ngram_size,
                                "no n-gram of this size of the prompt (T5: the encoder's "
                                "input) is repeated in the output (0: off)"),
                 0, 1 << 20));
  track("--bad-words-ids",
        one_value(cmd.add_option("--bad-words-ids", f.bad_words_ids,
                                 "token id sequences never generated, as JSON: \"[[12, 7], [9]]\" "
                                 "(the last id is banned where the others precede it)")));
  track("--suppress-tokens",
        one_value(cmd.add_option("--suppress-tokens", f.suppress_tokens,
                                 "token ids never generated, as JSON: \"[3, 7]\"")));
  track("--forced-bos-token-id",
        in_range(cmd.add_option("--forced-bos-token-id", f.forced_bos_token_id,
                                "the first generated token when the sequence is one token long "
                                "(T5: always; decoder-only: a one-token prompt)"),
                 0, kNoLimit));
  track("--forced-eos-token-id",
        one_value(cmd.add_option("--forced-eos-token-id", f.forced_eos_token_id,
                                 "the token generated last when --max-new-tokens is reached: an "
                                 "id, or a JSON list of ids")));
  in_range(cmd.add_option("--batch-size", f.batch_size,
                          "prompts in flight together; a new one joins as soon as one finishes")
               ->capture_default_str(),
           1, 1024);
  cmd.add_option("--prompt-template", f.prompt_template,
                 "wrap each prompt: every {prompt} is replaced by it, e.g. \"{prompt} =\" "
                 "(default: the plan's)");
}

GenerationParams to_params(const GenerationFlags& f, const ModelDesc& desc, const Logger& log) {
  GenerationParams p = default_generation_params(desc);
  const bool model_sets_length = desc.generation.max_new_tokens || desc.generation.max_length;
  if (f.was_given("--max-new-tokens") || !model_sets_length) {
    p.max_new_tokens = f.max_new_tokens;
    p.max_length = 0;
  }
  if (f.was_given("--min-new-tokens")) p.min_new_tokens = f.min_new_tokens;
  if (f.was_given("--min-length")) p.min_length = f.min_length;
  if (f.was_given("--beams")) p.num_beams = f.beams;
  if (f.was_given("--length-penalty")) p.length_penalty = f.length_penalty;
  if (f.was_given("--early-stopping")) {
    p.early_stopping = f.early_stopping == "true"    ? EarlyStopping::kAlways
                       : f.early_stopping == "never" ? EarlyStopping::kNever
                                                     : EarlyStopping::kHeuristic;
  }
  if (f.was_given("--temperature")) {
    p.do_sample = f.temperature > 0.0f;
    if (p.do_sample) p.temperature = f.temperature;
  }
  if (f.was_given("--top-k"))
    p.top_k = static_cast<int>(std::min<int64_t>(f.top_k, std::numeric_limits<int>::max()));
  if (f.was_given("--top-p")) p.top_p = f.top_p;
  if (f.was_given("--seed")) p.seed = static_cast<uint64_t>(f.seed);
  if (f.was_given("--repetition-penalty")) p.repetition_penalty = f.repetition_penalty;
  if (f.was_given("--no-repeat-ngram-size"))
    p.no_repeat_ngram_size = static_cast<int>(f.no_repeat_ngram_size);
  if (f.was_given("--encoder-no-repeat-ngram-size"))
    p.encoder_no_repeat_ngram_size = static_cast<int>(f.encoder_no_repeat_ngram_size);
  if (f.was_given("--bad-words-ids")) {
    const nlohmann::json v = parse_flag_json(f.bad_words_ids, "--bad-words-ids");
    KILN_CHECK_USAGE(v.is_array(),
                     "--bad-words-ids: expected a JSON list of lists of token ids such as "
                     "[[12, 7], [9]], got {}",
                     v.dump());
    p.bad_words_ids.clear();
    for (const nlohmann::json& words : v) {
      KILN_CHECK_USAGE(words.is_array() && !words.empty(),
                       "--bad-words-ids: each entry is a non-empty list of token ids such as "
                       "[12, 7], got {}",
                       words.dump());
      p.bad_words_ids.push_back(parse_id_list(words, "--bad-words-ids", false));
    }
  }
  if (f.was_given("--suppress-tokens"))
    p.suppress_tokens = parse_id_list(parse_flag_json(f.suppress_tokens, "--suppress-tokens"),
                                      "--suppress-tokens", false);
  if (f.was_given("--forced-bos-token-id")) p.forced_bos_token_id = f.forced_bos_token_id;
  if (f.was_given("--forced-eos-token-id"))
    p.forced_eos_token_ids =
        parse_id_list(parse_flag_json(f.forced_eos_token_id, "--forced-eos-token-id"),
                      "--forced-eos-token-id", true);
  // Flags that the resulting decoding strategy ignores: say so instead of ignoring silently.
  if (!p.do_sample)
    for (const char* flag : {"--top-k", "--top-p", "--seed"})
      if (f.was_given(flag))
        log.warn("{} has no effect without sampling (give --temperature > 0)", flag);
  if (p.num_beams == 1)
    for (const char* flag : {"--length-penalty", "--early-stopping"})
      if (f.was_given(flag)) log.warn("{} has no effect without beam search (--beams > 1)", flag);
  validate(p, desc.vocab_size);
  return p;
}

uint64_t run_seed(const GenerationFlags& f, const GenerationParams& p, const Logger& log) {
  if (f.was_given("--seed")) return static_cast<uint64_t>(f.seed);
  std::random_device entropy;
  // --seed takes 0..2^63-1: a logged seed must be one the flag accepts.
  const uint64_t seed =
      ((static_cast<uint64_t>(entropy()) << 32) | entropy()) & 0x7FFFFFFFFFFFFFFFull;
  if (p.do_sample) log.info("sampling seed: {} (repeat this run with --seed {})", seed, seed);
  return seed;
}

}  // namespace kiln::cli
