// The protocol-neutral request path: parameters, prompt checks, enqueueing, reading.
#include "server/generation_service.h"

#include <cmath>
#include <random>

#include "runtime/sampler.h"
#include "server/errors.h"

namespace kiln::server {

namespace {

using nlohmann::json;

int64_t get_int(const std::string& key, const json& v, int64_t lo, int64_t hi) {
  // JSON numbers that are whole (1 and 1.0 alike, as Python clients send them) are integers.
  bool ok = v.is_number_integer();
  int64_t out = 0;
  if (ok) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      ok = false;
    else
      out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    ok = std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15;
    out = ok ? static_cast<int64_t>(d) : 0;
  }
  KILN_BAD_REQUEST(ok, "parameter \"{}\" must be an integer, got {}", key, v.dump());
  KILN_BAD_REQUEST(out >= lo && out <= hi, "parameter \"{}\" must be in {}..{}, got {}", key, lo,
                   hi, out);
  return out;
}

double get_number(const std::string& key, const json& v) {
  KILN_BAD_REQUEST(v.is_number(), "parameter \"{}\" must be a number, got {}", key, v.dump());
  const double d = v.get<double>();
  KILN_BAD_REQUEST(std::isfinite(d), "parameter \"{}\" must be finite", key);
  return d;
}

bool get_bool(const std::string& key, const json& v) {
  KILN_BAD_REQUEST(v.is_boolean(), "parameter \"{}\" must be true or false, got {}", key, v.dump());
  return v.get<bool>();
}

}  // namespace

bool RequestParams::set(const std::string& key, const json& v) {
  if (key == "max_tokens" || key == "max_new_tokens") {
    max_tokens = get_int(key, v, 1, kMaxNewTokensLimit);
  } else if (key == "min_tokens" || key == "min_new_tokens") {
    min_tokens = get_int(key, v, 0, kMaxNewTokensLimit);
  } else if (key == "temperature") {
    const double t = get_number(key, v);
    KILN_BAD_REQUEST(t >= 0.0 && t <= 100.0,
                     "parameter \"temperature\" must be in 0..100 (0: "
                     "greedy), got {}",
                     t);
    temperature = t;
  } else if (key == "top_k") {
    top_k = get_int(key, v, 0, 1 << 20);
  } else if (key == "top_p") {
    const double p = get_number(key, v);
    KILN_BAD_REQUEST(p > 0.0 && p <= 1.0, "parameter \"top_p\" must be in (0, 1], got {}", p);
    top_p = p;
  } else if (key == "seed" || key == "random_seed") {
    seed = static_cast<uint64_t>(get_int(key, v, 0, INT64_MAX));
  } else if (key == "beam_width" || key == "num_beams") {
    beam_width = get_int(key, v, 1, kMaxBeams);
  } else if (key == "repetition_penalty") {
    const double r = get_number(key, v);
    KILN_BAD_REQUEST(r > 0.0, "parameter \"repetition_penalty\" must be > 0, got {}", r);
    repetition_penalty = r;
  } else if (key == "length_penalty") {
    length_penalty = get_number(key, v);
  } else if (key == "ignore_eos") {
    ignore_eos = get_bool(key, v);
  } else if (key == "return_token_ids") {
    return_token_ids = get_bool(key, v);
  } else if (key == "stop" || key == "stop_words") {
    stop.clear();
    if (v.is_null()) return true;
    KILN_BAD_REQUEST(v.is_string() || v.is_array(),
                     "parameter \"{}\" must be a string or a list of strings, got {}", key,
                     v.dump());
    const json list = v.is_string() ? json::array({v}) : v;
    KILN_BAD_REQUEST(list.size() <= kMaxStopStrings, "parameter \"{}\": at most {} strings, got {}",
                     key, kMaxStopStrings, list.size());
    for (const json& s : list) {
      KILN_BAD_REQUEST(s.is_string(), "parameter \"{}\" must hold strings, got {}", key, s.dump());
      const std::string text = s.get<std::string>();
      KILN_BAD_REQUEST(!text.empty() && text.size() <= kMaxStopStringBytes && valid_utf8(text),
                       "parameter \"{}\": each string must be 1..{} bytes of UTF-8", key,
                       kMaxStopStringBytes);
      stop.push_back(text);
    }
  } else if (key == "timeout") {
    // Triton's per-request timeout, in microseconds.
    timeout_us = get_int(key, v, 0, int64_t{3600} * 1'000'000);
  } else {
    return false;
  }
  return true;
}

GenerationParams resolve_params(const LoadedModel& model, const RequestParams& r) {
  const ModelDesc& desc = model.model().desc();
  GenerationParams p = default_generation_params(desc);
  if (model.settings().default_max_tokens > 0) {
    p.max_new_tokens = model.settings().default_max_tokens;
    p.max_length = 0;
  }
  if (r.max_tokens) {
    p.max_new_tokens = *r.max_tokens;
    p.max_length = 0;
  }
  if (r.min_tokens) p.min_new_tokens = *r.min_tokens;
  if (r.temperature) {
    if (*r.temperature == 0.0) {
      p.do_sample = false;
    } else {
      p.do_sample = true;
      p.temperature = static_cast<float>(*r.temperature);
    }
  }
  if (r.top_k) p.top_k = static_cast<int>(*r.top_k);
  if (r.top_p) p.top_p = static_cast<float>(*r.top_p);
  if (r.beam_width) {
    p.num_beams = static_cast<int>(*r.beam_width);
    if (p.num_beams > 1 && p.do_sample && !r.temperature) p.do_sample = false;
  }
  KILN_BAD_REQUEST(!(p.num_beams > 1 && p.do_sample),
                   "beam_width {} with temperature > 0: sampling with beam search is not "
                   "supported (set temperature 0)",
                   p.num_beams);
  if (r.repetition_penalty) p.repetition_penalty = static_cast<float>(*r.repetition_penalty);
  if (r.length_penalty) p.length_penalty = *r.length_penalty;
  if (r.ignore_eos) p.ignore_eos = *r.ignore_eos;
  KILN_BAD_REQUEST(!(p.ignore_eos && p.num_beams > 1),
                   "ignore_eos works with greedy or sampled generation, not beam_width > 1");
  p.stop_strings = r.stop;
  KILN_BAD_REQUEST(p.stop_strings.empty() || p.num_beams == 1,
                   "stop works with greedy or sampled generation, not beam_width {}", p.num_beams);
  if (r.seed) {
    p.seed = *r.seed;
  } else if (p.do_sample) {
    p.seed = std::random_device{}();
  }
  try {
    validate(p, desc.vocab_size);
  } catch (const Error& e) {
    throw ServerError(Code::kBadRequest, e.what());
  }
  return p;
}

// The request's parameters and prompt, resolved and checked (usage errors: 400 naming the field).
void Generation::check(const TextRequest& request) {
  KILN_BAD_REQUEST(valid_utf8(request.prompt), "the prompt is not valid UTF-8");
  KILN_BAD_REQUEST(!request.prompt.empty(), "the prompt is empty: nothing to generate from");
  params_ = resolve_params(*model_, request.params);
  if (request.seed_index > 0) params_.seed = derive_seed(params_.seed, request.seed_index);
  const CompiledModel& cm = model_->model();
  const std::string text = request.apply_template
                               ? apply_prompt_template(model_->prompt_template(), request.prompt)
                               : request.prompt;
  input_ids_ = cm.tokenizer().encode(text);
  const int64_t limit = cm.model().profile.max_input_tokens;
  KILN_BAD_REQUEST(!input_ids_.empty(), "the prompt has no tokens");
  KILN_BAD_REQUEST(static_cast<int64_t>(input_ids_.size()) <= limit,
                   "the prompt is {} tokens{}; model \"{}\" allows at most {}", input_ids_.size(),
                   model_->prompt_template() == "{prompt}" ? "" : " with its template",
                   model_->name(), limit);
}

Generation::Generation(std::shared_ptr<LoadedModel> model, const TextRequest& request)
    : model_(std::move(model)) {
  counting_refusals(*model_, [&] { check(request); });
  RequestOptions o;
  o.tag = request.protocol;
  if (request.params.timeout_us && *request.params.timeout_us > 0)
    o.deadline = Clock::now() + std::chrono::microseconds(*request.params.timeout_us);
  executor_ = &model_->pick();
  try {
    stream_ = executor_->enqueue(input_ids_, params_, o);
  } catch (const QueueFullError& e) {
    throw ServerError(Code::kQueueFull, e.what());
  } catch (const Error& e) {
    // A usage error (GenerationParams' own checks) never reached the queue: a refusal.
    if (e.kind() == ErrorKind::kUsage) ++model_->refused;
    throw ServerError(e.kind() == ErrorKind::kUsage ? Code::kBadRequest : Code::kUnavailable,
                      e.what());
  }
}

Generation::~Generation() {
  // A client that went away (or a frontend that stopped reading): free the KV blocks now.
  if (stream_ && !done_ && !stream_->finished()) executor_->cancel(stream_->id());
}

bool Generation::next(std::vector<ResponseChunk>& out, Clock::time_point until) {
  if (done_) return false;
  const size_t before = out.size();
  const bool more = stream_->next(out, until);
  for (size_t i = before; i < out.size(); ++i)
    if (out[i].finished) done_ = true;
  return more;
}

void Generation::cancel() {
  if (stream_ && !done_) executor_->cancel(stream_->id());
}

ServerError chunk_error(const ResponseChunk& last) {
  switch (last.cause) {
    case EndCause::kQueueTimeout:
    case EndCause::kTimeout:
      return {Code::kTimeout, last.error};
    case EndCause::kCancelled:
      return {Code::kUnavailable, "the request was cancelled (the server is stopping)"};
    default:
      return {Code::kInternal, last.error.empty() ? "generation failed" : last.error};
  }
}

Completion collect(Generation& g, const std::function<bool()>& client_gone) {
  Completion c;
  c.input_tokens = g.input_tokens();
  std::vector<ResponseChunk> chunks;
  bool cancelled = false;
  constexpr auto kEvery = std::chrono::milliseconds(100);
  Clock::time_point check = Clock::now() + kEvery;
  while (g.next(chunks, client_gone ? check : Clock::time_point::max())) {
    if (client_gone && !cancelled && Clock::now() >= check) {
      check = Clock::now() + kEvery;
      if (client_gone()) {
        g.cancel();  // its final chunk (cancelled) follows
        cancelled = true;
      }
    }
    for (ResponseChunk& ch : chunks) {
      if (!ch.token_ids.empty() && c.first_token == Clock::time_point{}) c.first_token = ch.time;
      c.text += ch.text;
      c.token_ids.insert(c.token_ids.end(), ch.token_ids.begin(), ch.token_ids.end());
      if (ch.finished) {
        if (ch.cause != EndCause::kFinished) throw chunk_error(ch);
        c.finish_reason = ch.finish_reason;
      }
    }
    chunks.clear();
  }
  return c;
}

}  // namespace kiln::server
