// Errors of the server layer, one kind per protocol status: every frontend maps ServerError's
// code to its protocol (HTTP status, gRPC status code, OpenAI error type) in one place.
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::server {

enum class Code {
  kBadRequest,    // HTTP 400, INVALID_ARGUMENT: a field is missing, of the wrong type or range
  kUnauthorized,  // HTTP 401, UNAUTHENTICATED
  kNotFound,      // HTTP 404, NOT_FOUND: unknown model, version or route
  kUnavailable,   // HTTP 503 / 400 (Triton: model not ready), UNAVAILABLE
  kQueueFull,     // HTTP 503, RESOURCE_EXHAUSTED
  kTimeout,       // HTTP 504, DEADLINE_EXCEEDED
  kTooLarge,      // HTTP 413, INVALID_ARGUMENT: the body is over --max-body-bytes
  kInternal,      // HTTP 500, INTERNAL
};

class ServerError : public Error {
 public:
  ServerError(Code code, std::string message)
      : Error(code == Code::kBadRequest ? ErrorKind::kUsage : ErrorKind::kRuntime,
              std::move(message), __FILE__, __LINE__),
        code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

#define KILN_SERVER_FAIL(code, ...) \
  throw ::kiln::server::ServerError(code, fmt::format(__VA_ARGS__))
#define KILN_BAD_REQUEST(cond, ...)                                                \
  do {                                                                             \
    if (!(cond)) KILN_SERVER_FAIL(::kiln::server::Code::kBadRequest, __VA_ARGS__); \
  } while (0)

// Any exception as a ServerError: kiln's usage errors are bad requests, QueueFullError is
// kQueueFull, everything else internal.
ServerError to_server_error(const std::exception& e);

int http_status(Code code);

}  // namespace kiln::server
