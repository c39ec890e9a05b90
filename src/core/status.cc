#include "core/status.h"

#include <filesystem>

namespace kiln {

void throw_error(ErrorKind kind, const char* file, int line, std::string message) {
  // Keep only the path below src/ so messages do not leak the build machine's layout.
  std::string where = file;
  if (auto pos = where.rfind("src/"); pos != std::string::npos) where = where.substr(pos);
  throw Error(kind, std::move(message) + " [" + where + ":" + std::to_string(line) + "]", file,
              line);
}

}  // namespace kiln
