#include <nlohmann/json.hpp>

#include "commands.h"

namespace kiln::cli {

Runner add_run(CLI::App& app) {
  struct Opts {
    std::string plan, model, input;
    std::vector<std::string> prompts;
    GenerationFlags gen;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Generate text with a plan (or, the quick path, an HF directory built in memory).\n"
      "Examples:\n"
      "  kiln run --plan t5.plan --prompt \"reverse: suvogi\"\n"
      "  kiln run --model models/bloom-tiny --prompt-template \"{prompt} =\" --prompt \"add: 456 + "
      "95\"\n"
      "  kiln run --plan t5.plan --input prompts.jsonl --beams 4 --json");
  cmd->add_option("--plan", o->plan, "plan file from `kiln build`");
  cmd->add_option("--model", o->model, "HF directory, built in memory (fp32, cpu)");
  cmd->add_option("--prompt", o->prompts, "prompt text (repeatable)");
  cmd->add_option("--input", o->input,
                  "JSON lines: a string or an object with \"text\"/\"prompt\"");
  cmd->add_flag(
      "--json", o->json,
      "one JSON object per prompt: {\"prompt\", \"input_ids\", \"output_ids\", \"text\"}");
  add_generation_flags(*cmd, o->gen);
  return [o](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->prompts.empty() != o->input.empty(),
                     "give prompts with --prompt or --input (one of them)");
    std::vector<std::string> prompts = o->input.empty() ? o->prompts : read_prompt_lines(o->input);
    KILN_CHECK_USAGE(!prompts.empty(), "no prompts in {}", o->input);
    auto ctx = make_context(g);
    auto engine = open_engine(*ctx, o->plan, o->model);
    const std::vector<Generated> results = generate_all(*engine, prompts, o->gen, true);
    for (const Generated& r : results) {
      if (o->json) {
        fmt::print("{}\n", nlohmann::json{{"prompt", r.prompt},
                                          {"input_ids", r.input_ids},
                                          {"output_ids", r.result.output_ids},
                                          {"text", r.text}}
                               .dump());
      } else {
        fmt::print("{}\n", r.text);
      }
    }
    return 0;
  };
}

}  // namespace kiln::cli
