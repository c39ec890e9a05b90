// The OpenAI-compatible API: GET /v1/models, POST /v1/completions and /v1/chat/completions, with
// `stream: true` as `data:` events ending in `data: [DONE]`, and OpenAI's error format.
//
// Unset sampling fields keep the model's defaults (its generation_config: greedy for HF's
// defaults), not OpenAI's temperature 1: the same request gives what `kiln run` gives.
#include <atomic>
#include <ctime>
#include <set>

#include "server/http_routes.h"

namespace kiln::server {

namespace {

constexpr int kMaxChoices = 16;

std::string make_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}-{:x}{:06x}", prefix, static_cast<uint64_t>(std::time(nullptr)),
                     counter.fetch_add(1) & 0xFFFFFF);
}

struct OpenAiRequest {
  std::shared_ptr<LoadedModel> model;
  std::vector<std::string> prompts;
  RequestParams params;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool apply_template = true;
};

// Fields OpenAI defines that kiln takes, ignores harmlessly, or refuses unless at their default.
void common_field(OpenAiRequest& r, const std::string& key, const Json& v) {
  if (key == "model" || key == "user" || key == "prompt" || key == "messages") return;
  if (key == "n") {
    KILN_BAD_REQUEST(
        v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= kMaxChoices,
        "n must be an integer in 1..{}, got {}", kMaxChoices, v.dump());
    r.n = static_cast<int>(v.get<int64_t>());
  } else if (key == "stream") {
    KILN_BAD_REQUEST(v.is_boolean() || v.is_null(), "stream must be true or false");
    r.stream = v.is_boolean() && v.get<bool>();
  } else if (key == "stream_options") {
    if (v.is_null()) return;
    KILN_BAD_REQUEST(v.is_object(), "stream_options must be an object");
    if (v.contains("include_usage")) {
      KILN_BAD_REQUEST(v["include_usage"].is_boolean(), "include_usage must be true or false");
      r.include_usage = v["include_usage"].get<bool>();
    }
  } else if (key == "max_tokens" || key == "max_completion_tokens") {
    if (!v.is_null()) r.params.set("max_tokens", v);
  } else if (key == "temperature" || key == "top_p" || key == "seed" || key == "stop" ||
             key == "top_k" || key == "min_tokens" || key == "repetition_penalty" ||
             key == "ignore_eos") {
    if (!v.is_null()) r.params.set(key, v);
  } else if (key == "presence_penalty" || key == "frequency_penalty") {
    KILN_BAD_REQUEST(v.is_null() || (v.is_number() && v.get<double>() == 0.0),
                     "{} is not supported (HF models use repetition_penalty, which kiln "
                     "takes)",
                     key);
  } else if (key == "logprobs" || key == "top_logprobs") {
    KILN_BAD_REQUEST(v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                         (v.is_number_integer() && v.get<int64_t>() == 0),
                     "{} is not supported by kiln yet", key);
  } else if (key == "echo" || key == "suffix" || key == "logit_bias" || key == "tools" ||
             key == "response_format" || key == "best_of") {
    const bool neutral = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                         (v.is_object() && v.empty()) || (v.is_array() && v.empty()) ||
                         (key == "best_of" && v.is_number_integer() && v.get<int64_t>() <= 1);
    KILN_BAD_REQUEST(neutral, "{} is not supported by kiln", key);
  } else {
    KILN_SERVER_FAIL(Code::kBadRequest, "unknown field \"{}\"", key);
  }
}

std::shared_ptr<LoadedModel> model_of(const HttpFrontend::Context& ctx, const Json& j) {
  KILN_BAD_REQUEST(j.contains("model") && j["model"].is_string(),
                   "\"model\" (a string) is required");
  return ctx.models.get(j["model"].get<std::string>());
}

// The body's fields into `r` (its model is set).
void parse_completion_fields(OpenAiRequest& r, const Json& j) {
  KILN_BAD_REQUEST(j.contains("prompt"), "\"prompt\" is required");
  const Json& p = j["prompt"];
  if (p.is_string()) {
    r.prompts.push_back(p.get<std::string>());
  } else {
    KILN_BAD_REQUEST(p.is_array() && !p.empty() && p.size() <= 64,
                     "\"prompt\" must be a string or a list of 1..64 strings");
    for (const Json& e : p) {
      KILN_BAD_REQUEST(e.is_string(), "\"prompt\" as token ids is not supported; send text");
      r.prompts.push_back(e.get<std::string>());
    }
  }
  for (const auto& [key, value] : j.items()) common_field(r, key, value);
}

// The body's fields into `r` (its model is set). Chat messages make one prompt: with a prompt
// template, every message's text (role-prefixed when there are several) goes into it; without
// one, the last user message is the prompt.
void parse_chat_fields(OpenAiRequest& r, const Json& j) {
  KILN_BAD_REQUEST(j.contains("messages") && j["messages"].is_array() && !j["messages"].empty(),
                   "\"messages\" must be a non-empty list");
  std::vector<std::pair<std::string, std::string>> messages;
  for (const Json& m : j["messages"]) {
    KILN_BAD_REQUEST(m.is_object() && m.contains("role") && m["role"].is_string(),
                     "each message needs a \"role\" string");
    const std::string role = m["role"].get<std::string>();
    KILN_BAD_REQUEST(
        role == "system" || role == "user" || role == "assistant" || role == "developer",
        "message role \"{}\" is not one of system, developer, user, assistant", role);
    KILN_BAD_REQUEST(m.contains("content"), "each message needs \"content\"");
    std::string text;
    const Json& c = m["content"];
    if (c.is_string()) {
      text = c.get<std::string>();
    } else {
      KILN_BAD_REQUEST(c.is_array(), "message content must be a string or a list of parts");
      for (const Json& part : c) {
        KILN_BAD_REQUEST(part.is_object() && part.value("type", "") == "text" &&
                             part.contains("text") && part["text"].is_string(),
                         "message content parts must be {{\"type\": \"text\", \"text\": ...}}");
        text += part["text"].get<std::string>();
      }
    }
    messages.emplace_back(role, text);
  }
  const bool templated = r.model->prompt_template() != "{prompt}";
  std::string prompt;
  if (templated && messages.size() > 1) {
    for (const auto& [role, text] : messages) {
      if (!prompt.empty()) prompt += "\n";
      prompt += role + ": " + text;
    }
  } else {
    for (auto it = messages.rbegin(); it != messages.rend(); ++it)
      if (it->first == "user") {
        prompt = it->second;
        break;
      }
    KILN_BAD_REQUEST(templated || !prompt.empty(), "no user message to answer");
    if (prompt.empty()) prompt = messages.back().second;
  }
  r.prompts.push_back(prompt);
  for (const auto& [key, value] : j.items()) common_field(r, key, value);
}

// A completion or chat request: the model routed first, then the fields (`fields`), whose
// refusals count against that model.
OpenAiRequest parse_request(const HttpFrontend::Context& ctx, const std::string& body,
                            void (*fields)(OpenAiRequest&, const Json&)) {
  check_not_draining(ctx);
  const Json j = parse_body(body);
  OpenAiRequest r;
  r.model = model_of(ctx, j);
  counting_refusals(*r.model, [&] { fields(r, j); });
  return r;
}

Json usage(int64_t prompt, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

const char* openai_finish(FinishReason r) { return r == FinishReason::kLength ? "length" : "stop"; }

void respond(const httplib::Request& req, const OpenAiRequest& r, bool chat,
             httplib::Response& res) {
  const std::string id = make_id(chat ? "chatcmpl" : "cmpl");
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const std::string model = r.model->name();
  // Every choice is enqueued before any is read, so they run in one batch: choice
  // p * n + i is prompt p's i-th sample.
  std::vector<std::shared_ptr<Generation>> gens;
  int64_t prompt_tokens = 0;
  for (const std::string& prompt : r.prompts)
    for (int i = 0; i < r.n; ++i) {
      TextRequest t;
      t.protocol = "openai";
      t.prompt = prompt;
      t.params = r.params;
      t.seed_index = static_cast<uint64_t>(i);
      gens.push_back(std::make_shared<Generation>(r.model, t));
      if (i == 0) prompt_tokens += gens.back()->input_tokens();
    }
  if (r.stream) {
    const char* object = chat ? "chat.completion.chunk" : "text_completion";
    // Per choice: whether its first chunk (chat: the one with the role) is still to come.
    auto first = std::make_shared<std::vector<bool>>(gens.size(), true);
    auto produced = std::make_shared<int64_t>(0);
    const bool include_usage = r.include_usage;
    auto chunk_json = [=](size_t index, const std::string& text, const char* finish) {
      Json choice{{"index", index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (finish != nullptr) choice["finish_reason"] = finish;
      if (chat) {
        Json delta = Json::object();
        if ((*first)[index]) delta["role"] = "assistant";
        if (!text.empty() || finish == nullptr) delta["content"] = text;
        choice["delta"] = delta;
      } else {
        choice["text"] = text;
      }
      (*first)[index] = false;
      Json j{{"id", id},
             {"object", object},
             {"created", created},
             {"model", model},
             {"choices", Json::array({choice})}};
      return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
    };
    auto failed = std::make_shared<bool>(false);
    stream_events(
        res, std::move(gens),
        [=](size_t i, const ResponseChunk& c) -> std::string {
          *produced += static_cast<int64_t>(c.token_ids.size());
          std::string out;
          if (!c.text.empty() || (chat && (*first)[i] && !c.finished))
            out += chunk_json(i, c.text, nullptr);
          if (c.finished) out += chunk_json(i, "", openai_finish(c.finish_reason));
          return out;
        },
        [failed](const ServerError& e) {
          *failed = true;
          Json err{{"error", {{"message", e.what()}, {"type", "server_error"}, {"code", nullptr}}}};
          return "data: " + err.dump() + "\n\n";
        },
        [=] {
          std::string out;
          if (include_usage && !*failed) {
            Json u{{"id", id},
                   {"object", object},
                   {"created", created},
                   {"model", model},
                   {"choices", Json::array()},
                   {"usage", usage(prompt_tokens, *produced)}};
            out += "data: " + u.dump() + "\n\n";
          }
          return out + "data: [DONE]\n\n";
        });
    return;
  }
  Json choices = Json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < gens.size(); ++i) {
    const Completion c = collect_for(req, *gens[i]);
    completion_tokens += static_cast<int64_t>(c.token_ids.size());
    Json choice{
        {"index", i}, {"logprobs", nullptr}, {"finish_reason", openai_finish(c.finish_reason)}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else
      choice["text"] = c.text;
    choices.push_back(choice);
  }
  reply_json(res, {{"id", id},
                   {"object", chat ? "chat.completion" : "text_completion"},
                   {"created", created},
                   {"model", model},
                   {"choices", choices},
                   {"usage", usage(prompt_tokens, completion_tokens)}});
}

}  // namespace

void add_openai_routes(httplib::Server& svr, HttpFrontend::Context& ctx) {
  svr.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    Json data = Json::array();
    std::set<std::string> seen;
    for (const auto& m : ctx.models.ready_models())
      if (seen.insert(m->name()).second)
        data.push_back(
            {{"id", m->name()}, {"object", "model"}, {"created", 0}, {"owned_by", "kiln"}});
    reply_json(res, {{"object", "list"}, {"data", data}});
  });
  svr.Get(R"(/v1/models/([^/]+))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(
        res,
        [&] {
          auto m = ctx.models.get(req.matches[1].str());
          reply_json(
              res, {{"id", m->name()}, {"object", "model"}, {"created", 0}, {"owned_by", "kiln"}});
        },
        /*openai=*/true);
  });
  svr.Post("/v1/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(
        res,
        [&] { respond(req, parse_request(ctx, req.body, parse_completion_fields), false, res); },
        true);
  });
  svr.Post("/v1/chat/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(
        res, [&] { respond(req, parse_request(ctx, req.body, parse_chat_fields), true, res); },
        true);
  });
}

}  // namespace kiln::server
