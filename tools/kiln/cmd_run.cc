#include <unistd.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "output.h"

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
      "run", "Generate text with a plan (or, the quick path, an HF directory built in memory)");
  describe(cmd,
           "Results are printed in prompt order, each as soon as it is ready. Every prompt is\n"
           "checked (UTF-8, not empty, not longer than the plan allows) before generating.\n"
           "Examples:\n"
           "  kiln run --plan t5.plan --prompt \"reverse: suvogi\"\n"
           "  kiln run --model models/bloom-tiny --prompt-template \"{prompt} =\" --prompt \"add: "
           "456 + 95\"\n"
           "  kiln run --plan t5.plan --input prompts.jsonl --beams 4 --json");
  cmd->add_option("--plan", o->plan, "plan file from `kiln build`");
  cmd->add_option("--model", o->model, "HF directory, built in memory (fp32, cpu)");
  one_value(cmd->add_option("--prompt", o->prompts,
                            "one prompt, exactly as given (repeatable: one prompt each)"));
  cmd->add_option("--input", o->input,
                  "JSON lines: a string or an object with \"text\"/\"prompt\" (- reads standard "
                  "input)");
  cmd->add_flag(
      "--json", o->json,
      "one JSON object per prompt: {\"prompt\", \"input_ids\", \"output_ids\", \"text\"}");
  add_generation_flags(*cmd, o->gen);
  return [o](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->prompts.empty() || o->input.empty(),
                     "give prompts with --prompt or --input, not both");
    KILN_CHECK_USAGE(!o->prompts.empty() || !o->input.empty(),
                     "give prompts with --prompt TEXT (repeatable) or --input FILE.jsonl");
    KILN_CHECK_USAGE(o->plan.empty() != o->model.empty(), "give exactly one of --plan or --model");
    const std::vector<TextInput> prompts = o->input.empty()
                                               ? inputs_from_flag(o->prompts, "--prompt")
                                               : read_prompt_lines(o->input, "--input");
    KILN_CHECK_USAGE(!prompts.empty(), "{}: no prompts (every line is blank)",
                     input_name(o->input));
    auto ctx = make_context(g);
    auto engine = open_engine(*ctx, o->plan, o->model);
    const bool same_terminal = isatty(STDOUT_FILENO) != 0 && isatty(STDERR_FILENO) != 0;
    // Results are printed as soon as they (and every one before them) are ready, so that a
    // reader that stops early (`| head -1`) stops the work too.
    generate_all(*engine, prompts, o->gen, o->model,
                 [&](size_t, const Generated& r, Progress& progress) -> std::string {
                   // Results and the progress line share one terminal: keep them apart.
                   if (same_terminal) progress.hide();
                   if (o->json) {
                     const nlohmann::json j{{"prompt", r.prompt},
                                            {"input_ids", r.input_ids},
                                            {"output_ids", r.result.output_ids},
                                            {"text", r.text}};
                     out_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
                   } else {
                     out_line(r.text);
                   }
                   if (same_terminal) progress.show();
                   return "";
                 });
    return 0;
  };
}

}  // namespace kiln::cli
