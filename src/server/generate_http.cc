// Triton's generate extension: POST /v2/models/{m}[/versions/{v}]/generate (one JSON answer) and
// .../generate_stream (Server-Sent Events, one event per detokenized chunk). The body is
// {"text_input": "...", "parameters": {...}}; like Triton, parameters may also be top-level
// fields (max_tokens, temperature, ...).
#include "server/http_routes.h"

namespace kiln::server {

namespace {

struct GenerateRequest {
  std::shared_ptr<LoadedModel> model;
  TextRequest text;
  std::string id;
};

void parse_fields(GenerateRequest& g, const std::string& body);

GenerateRequest parse(const HttpFrontend::Context& ctx, const httplib::Request& req) {
  check_not_draining(ctx);
  GenerateRequest g;
  g.model =
      ctx.models.get(req.matches[1].str(), req.matches.size() > 2 ? req.matches[2].str() : "");
  counting_refusals(*g.model, [&] { parse_fields(g, req.body); });
  return g;
}

// The body's fields into `g` (its model is set).
void parse_fields(GenerateRequest& g, const std::string& body) {
  const Json j = parse_body(body);
  const std::string& input = g.model->settings().input_name;
  bool have_text = false;
  for (const auto& [key, value] : j.items()) {
    if (key == input || key == "text_input") {
      KILN_BAD_REQUEST(value.is_string(), "\"{}\" must be a string, got {}", key, value.dump());
      g.text.prompt = value.get<std::string>();
      have_text = true;
    } else if (key == "id") {
      KILN_BAD_REQUEST(value.is_string(), "\"id\" must be a string");
      g.id = value.get<std::string>();
    } else if (key == "parameters") {
      KILN_BAD_REQUEST(value.is_object(), "\"parameters\" must be an object");
      for (const auto& [k, v] : value.items())
        KILN_BAD_REQUEST(g.text.params.set(k, v), "unknown parameter \"{}\"", k);
    } else if (key == "stream" || key == "bad_words" || key == "stop_words") {
      // Fields Triton's TensorRT-LLM ensembles send; empty ones mean nothing.
      if (key == "stop_words" && !(value.is_string() && value.get<std::string>().empty()))
        g.text.params.set("stop", value);
      else if (key == "bad_words")
        KILN_BAD_REQUEST(value.is_string() && value.get<std::string>().empty(),
                         "\"bad_words\" strings are not supported (use bad_words_ids in the "
                         "model's generation_config)");
    } else if (!g.text.params.set(key, value)) {
      KILN_SERVER_FAIL(Code::kBadRequest,
                       "unknown field \"{}\" (the prompt goes in \"{}\"; "
                       "generation settings are max_tokens, temperature, top_k, top_p, seed, "
                       "beam_width, stop, return_token_ids, ...)",
                       key, input);
    }
  }
  KILN_BAD_REQUEST(have_text, "\"{}\" (the prompt) is missing", input);
  g.text.protocol = "generate";
}

Json head(const GenerateRequest& r) {
  Json j{{"model_name", r.model->name()}, {"model_version", std::to_string(r.model->version())}};
  if (!r.id.empty()) j["id"] = r.id;
  return j;
}

}  // namespace

void add_generate_routes(httplib::Server& svr, HttpFrontend::Context& ctx) {
  svr.Post(std::string(kModelRoute) + "/generate", [&ctx](const httplib::Request& req,
                                                          httplib::Response& res) {
    guarded(res, [&] {
      GenerateRequest r = parse(ctx, req);
      Generation g(r.model, r.text);
      const Completion c = collect_for(req, g);
      Json j = head(r);
      j[r.model->settings().output_name] = c.text;
      j["finish_reason"] = finish_reason_name(c.finish_reason);
      j["usage"] = {{"prompt_tokens", c.input_tokens}, {"completion_tokens", c.token_ids.size()}};
      if (r.text.params.return_token_ids) j["token_ids"] = c.token_ids;
      reply_json(res, j);
    });
  });
  svr.Post(std::string(kModelRoute) + "/generate_stream", [&ctx](const httplib::Request& req,
                                                                 httplib::Response& res) {
    guarded(res, [&] {
      GenerateRequest r = parse(ctx, req);
      auto g = std::make_shared<Generation>(r.model, r.text);
      const Json base = head(r);
      const std::string out_name = r.model->settings().output_name;
      const bool ids = r.text.params.return_token_ids;
      stream_events(
          res, g,
          [base, out_name, ids](const ResponseChunk& c) -> std::string {
            if (c.text.empty() && c.token_ids.empty() && !c.finished) return "";
            Json j = base;
            j[out_name] = c.text;
            if (ids) j["token_ids"] = c.token_ids;
            if (c.finished) j["finish_reason"] = finish_reason_name(c.finish_reason);
            return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
          },
          [](const ServerError& e) {
            return "data: " + Json{{"error", e.what()}}.dump() + "\n\n";
          },
          [] { return std::string(); });
    });
  });
}

}  // namespace kiln::server
