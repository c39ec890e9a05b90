// An application of the public API alone: it includes only kiln/ headers and links only the
// runtime library (no frontend, no passes, no builder), which is what `kiln run --plan` needs.
// Usage: kiln_runtime_only PLAN PROMPT... — prints one generated text per line.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "kiln/engine.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PLAN PROMPT...\n", argv[0]);
    return 2;
  }
  try {
    auto engine = kiln::Engine::load(argv[1], kiln::EngineOptions{2, 8, false});
    std::vector<std::string> prompts(argv + 2, argv + argc);
    for (const kiln::TextResult& r : engine->generate(prompts, engine->default_params()))
      std::printf("%s\n", r.text.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
