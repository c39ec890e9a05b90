#include "server/errors.h"

#include "runtime/generation_executor.h"

namespace kiln::server {

ServerError to_server_error(const std::exception& e) {
  if (auto* s = dynamic_cast<const ServerError*>(&e)) return *s;
  if (dynamic_cast<const QueueFullError*>(&e) != nullptr) return {Code::kQueueFull, e.what()};
  if (auto* k = dynamic_cast<const Error*>(&e)) {
    if (k->kind() == ErrorKind::kUsage) return {Code::kBadRequest, e.what()};
    if (k->kind() == ErrorKind::kNotFound) return {Code::kNotFound, e.what()};
  }
  return {Code::kInternal, e.what()};
}

int http_status(Code code) {
  switch (code) {
    case Code::kBadRequest:
      return 400;
    case Code::kUnauthorized:
      return 401;
    case Code::kNotFound:
      return 404;
    case Code::kTooLarge:
      return 413;
    case Code::kUnavailable:
    case Code::kQueueFull:
      return 503;
    case Code::kTimeout:
      return 504;
    case Code::kInternal:
      return 500;
  }
  return 500;
}

}  // namespace kiln::server
