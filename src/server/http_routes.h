// What the HTTP route files (kserve_http.cc, generate_http.cc, openai_http.cc) share: the
// frontend's context, JSON replies in each protocol's error format, and Server-Sent Events
// streaming of a Generation. Private to the HTTP frontend.
#pragma once

#include <httplib.h>

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/errors.h"
#include "server/generation_service.h"
#include "server/http_frontend.h"

namespace kiln::server {

struct HttpFrontend::Context {
  ModelManager& models;
  const Logger& log;
  const std::atomic<bool>& draining;
};

using Json = nlohmann::json;

// /v2/models/{m}[/versions/{v}]: model names are [A-Za-z0-9_.-]+ (anything else matches no route:
// 404), versions digits; matches[1] is the model, matches[2] the version ("" when absent).
inline constexpr const char* kModelRoute =
    R"(/v2/models/([A-Za-z0-9_.\-]+)(?:/versions/([0-9]+))?)";

// {"error": "..."} with the code's HTTP status (KServe / Triton).
void reply_error(httplib::Response& res, const ServerError& e);
void reply_json(httplib::Response& res, const Json& body, int status = 200);
// The request body as a JSON object; throws kBadRequest naming the parse error's byte offset.
Json parse_body(const std::string& body, const char* what = "request body");
// Runs `fn`, turning any exception into reply_error (or OpenAI's error format).
void guarded(httplib::Response& res, const std::function<void()>& fn, bool openai = false);
// OpenAI's {"error": {"message", "type", "param", "code"}}.
void reply_openai_error(httplib::Response& res, const ServerError& e);
// Throws kUnavailable while the server drains (new inference requests are refused).
void check_not_draining(const HttpFrontend::Context& ctx);

// Streams a generation as Server-Sent Events: `event(chunk)` makes each `data:` payload (empty:
// nothing sent for that chunk), `end()` the lines after the final chunk (e.g. "data: [DONE]").
// A client that goes away cancels the generation (its KV blocks are freed before the next
// step); while nothing is generated (queued), a comment line every second finds that out.
void stream_events(httplib::Response& res, std::shared_ptr<Generation> g,
                   std::function<std::string(const ResponseChunk&)> event,
                   std::function<std::string(const ServerError&)> error_event,
                   std::function<std::string()> end);
// Several generations on one stream (OpenAI's n and prompt lists): `event(i, chunk)` for
// generation i, in the order the chunks come; `end()` once all have finished. An error end of
// any of them sends `error_event`, cancels the others and ends the stream.
void stream_events(httplib::Response& res, std::vector<std::shared_ptr<Generation>> gens,
                   std::function<std::string(size_t, const ResponseChunk&)> event,
                   std::function<std::string(const ServerError&)> error_event,
                   std::function<std::string()> end);

// Whether the client of `req` has closed its connection (a non-streamed request's client that
// timed out): its socket, found by the peer's address and port, reads end-of-file.
bool client_gone(const httplib::Request& req);
// collect(g) that cancels the generation when the client of `req` goes away.
inline Completion collect_for(const httplib::Request& req, Generation& g) {
  return collect(g, [&req] { return client_gone(req); });
}

void add_kserve_routes(httplib::Server& svr, HttpFrontend::Context& ctx);
void add_generate_routes(httplib::Server& svr, HttpFrontend::Context& ctx);
void add_openai_routes(httplib::Server& svr, HttpFrontend::Context& ctx);

}  // namespace kiln::server
