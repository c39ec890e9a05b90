// KServe v2 (Open Inference Protocol) over HTTP, with Triton's repository and statistics
// extensions: health, server and model metadata, config, stats, infer (JSON and binary tensors),
// repository index/load/unload.
#include <google/protobuf/util/json_util.h>

#include "core/version.h"
#include "server/http_routes.h"
#include "server/infer_tensors.h"

namespace kiln::server {

namespace {

std::string pattern(const std::string& tail) { return std::string(kModelRoute) + tail; }

std::string version_of(const httplib::Request& req) {
  return req.matches.size() > 2 ? req.matches[2].str() : "";
}

Json model_metadata(const LoadedModel& m, const std::vector<std::string>& versions) {
  const ModelSettings& s = m.settings();
  Json inputs = Json::array();
  inputs.push_back({{"name", s.input_name}, {"datatype", "BYTES"}, {"shape", {-1}}});
  Json outputs = Json::array();
  outputs.push_back({{"name", s.output_name}, {"datatype", "BYTES"}, {"shape", {-1}}});
  outputs.push_back({{"name", "token_ids"}, {"datatype", "INT64"}, {"shape", {-1, -1}}});
  return {{"name", m.name()},
          {"versions", versions},
          {"platform", "kiln_plan"},
          {"inputs", inputs},
          {"outputs", outputs}};
}

Json duration(int64_t count, int64_t us) { return {{"count", count}, {"ns", us * 1000}}; }

// As the gRPC frontend's (fill_statistics): durations are totals over successful requests;
// failures are counted without one.
Json model_stats(const LoadedModel& m) {
  const ExecutorStats s = m.stats();
  const int64_t done = s.success;
  const int64_t last_ms = s.last_request == Clock::time_point{}
                              ? 0
                              : std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::system_clock::now().time_since_epoch() -
                                    std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                        Clock::now() - s.last_request))
                                    .count();
  return {{"name", m.name()},
          {"version", std::to_string(m.version())},
          {"last_inference", last_ms},
          {"inference_count", done},
          {"execution_count", s.steps},
          {"inference_stats",
           {{"success", duration(s.success, s.request_us)},
            {"fail", duration(m.failed(s), 0)},
            {"queue", duration(done, s.queue_us)},
            {"compute_input", duration(done, 0)},
            {"compute_infer", duration(done, s.compute_us)},
            {"compute_output", duration(done, 0)}}},
          {"batch_stats", Json::array()}};
}

void get_config(const HttpFrontend::Context& ctx, const httplib::Request& req,
                httplib::Response& res) {
  auto m = ctx.models.get(req.matches[1].str(), version_of(req));
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  const auto status = google::protobuf::util::MessageToJsonString(m->settings().config, &out, o);
  if (!status.ok()) KILN_SERVER_FAIL(Code::kInternal, "config to JSON: {}", status.ToString());
  res.set_content(out, "application/json");
}

void infer(HttpFrontend::Context& ctx, const httplib::Request& req, httplib::Response& res) {
  check_not_draining(ctx);
  auto model = ctx.models.get(req.matches[1].str(), version_of(req));
  std::optional<int64_t> header_length;
  if (req.has_header("Inference-Header-Content-Length")) {
    const std::string v = req.get_header_value("Inference-Header-Content-Length");
    int64_t n = -1;
    try {
      size_t used = 0;
      n = std::stoll(v, &used);
      if (used != v.size()) n = -1;
    } catch (const std::exception&) {
      n = -1;
    }
    KILN_BAD_REQUEST(n >= 0, "Inference-Header-Content-Length \"{}\" is not a byte count", v);
    header_length = n;
  }
  const InferRequest r = counting_refusals(
      *model, [&] { return parse_infer_request(req.body, header_length, model->settings()); });
  // Every prompt is enqueued before any is read: they run in one batch.
  std::vector<std::unique_ptr<Generation>> gens;
  for (const std::string& prompt : r.prompts) {
    TextRequest t;
    t.protocol = "kserve";
    t.prompt = prompt;
    t.params = r.params;
    gens.push_back(std::make_unique<Generation>(model, t));
  }
  std::vector<Completion> results;
  for (auto& g : gens) results.push_back(collect_for(req, *g));
  InferResponseBody out =
      make_infer_response(r, model->name(), model->version(), model->settings(), results);
  if (out.header_length)
    res.set_header("Inference-Header-Content-Length", std::to_string(*out.header_length));
  res.set_content(out.body, out.content_type.c_str());
}

Json index_json(const ModelManager& models, bool ready_only) {
  Json out = Json::array();
  for (const IndexEntry& e : models.index(ready_only)) {
    Json j{{"name", e.name}, {"state", state_name(e.state)}};
    if (!e.version.empty()) j["version"] = e.version;
    j["reason"] = e.reason;
    out.push_back(j);
  }
  return out;
}

}  // namespace

void add_kserve_routes(httplib::Server& svr, HttpFrontend::Context& ctx) {
  svr.Get("/v2/health/live",
          [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  svr.Get("/v2/health/ready", [&ctx](const httplib::Request&, httplib::Response& res) {
    // Triton: 200 when every model that should be loaded is, 400 otherwise.
    res.status = !ctx.draining.load() && ctx.models.all_ready() ? 200 : 400;
  });
  svr.Get("/v2", [](const httplib::Request&, httplib::Response& res) {
    reply_json(res, {{"name", "kiln"},
                     {"version", version_string()},
                     {"extensions",
                      {"classification", "model_repository", "model_configuration", "statistics",
                       "binary_tensor_data", "generate", "openai"}}});
  });
  svr.Get("/v2/models/stats", [&ctx](const httplib::Request&, httplib::Response& res) {
    Json all = Json::array();
    for (const auto& m : ctx.models.ready_models()) all.push_back(model_stats(*m));
    reply_json(res, {{"model_stats", all}});
  });
  svr.Get(pattern("/ready"), [&ctx](const httplib::Request& req, httplib::Response& res) {
    bool ready = false;
    try {
      ready = ctx.models.get(req.matches[1].str(), version_of(req)) != nullptr;
    } catch (const std::exception&) {
      ready = false;
    }
    res.status = ready && !ctx.draining.load() ? 200 : 400;
  });
  svr.Get(pattern(""), [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const std::string name = req.matches[1].str();
      auto m = ctx.models.get(name, version_of(req));
      std::vector<std::string> versions;
      for (const auto& r : ctx.models.ready_models())
        if (r->name() == name) versions.push_back(std::to_string(r->version()));
      reply_json(res, model_metadata(*m, versions));
    });
  });
  svr.Get(pattern("/config"), [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { get_config(ctx, req, res); });
  });
  svr.Get(pattern("/stats"), [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      auto m = ctx.models.get(req.matches[1].str(), version_of(req));
      reply_json(res, {{"model_stats", Json::array({model_stats(*m)})}});
    });
  });
  svr.Post(pattern("/infer"), [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { infer(ctx, req, res); });
  });
  svr.Post("/v2/repository/index", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      bool ready_only = false;
      if (!req.body.empty()) {
        const Json j = parse_body(req.body);
        if (j.contains("ready")) {
          KILN_BAD_REQUEST(j["ready"].is_boolean(), "\"ready\" must be true or false");
          ready_only = j["ready"].get<bool>();
        }
      }
      reply_json(res, index_json(ctx.models, ready_only));
    });
  });
  const std::string repo_model = R"(/v2/repository/models/([^/]+))";
  svr.Post(repo_model + "/load", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      if (!ctx.models.explicit_control())
        KILN_SERVER_FAIL(Code::kBadRequest,
                         "explicit model load/unload is not allowed: start the server with "
                         "--model-control-mode explicit");
      ctx.models.load(req.matches[1].str());
      res.status = 200;
    });
  });
  svr.Post(repo_model + "/unload", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      if (!ctx.models.explicit_control())
        KILN_SERVER_FAIL(Code::kBadRequest,
                         "explicit model load/unload is not allowed: start the server with "
                         "--model-control-mode explicit");
      ctx.models.unload(req.matches[1].str());
      res.status = 200;
    });
  });
}

}  // namespace kiln::server
