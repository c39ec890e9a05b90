#include "core/status.h"

namespace kiln {

std::string Error::where() const {
  std::string path = file_ == nullptr ? "?" : file_;
  for (const char* top : {"src/", "tools/"})
    if (auto pos = path.rfind(top); pos != std::string::npos) {
      path = path.substr(pos);
      break;
    }
  return path + ":" + std::to_string(line_);
}

void throw_error(ErrorKind kind, const char* file, int line, std::string message) {
  throw Error(kind, std::move(message), file, line);
}

}  // namespace kiln
