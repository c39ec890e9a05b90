// kiln calibrate: INT8 calibration of a float plan over calibration prompts, written as a
// calibration cache (passes/calibration_cache.h) for a later int8 build.
#include "builder/calibration_runner.h"
#include "commands.h"
#include "io/atomic_file.h"

namespace kiln::cli {

Runner add_calibrate(CLI::App& app) {
  struct Opts {
    std::string plan, calib, output, method = "entropy";
    int batch = 8;
    int64_t new_tokens = 8;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Record every Linear's input range over calibration prompts and write an INT8 "
      "calibration cache");
  describe(cmd,
           "Runs the float plan over the prompts (encoder and decoder: each prompt is generated\n"
           "from greedily for --calib-tokens tokens) and records a histogram of |x| for the\n"
           "input of every Linear, then writes one int8 scale per tensor (threshold / 127):\n"
           "  entropy          TensorRT's KL-divergence threshold (clips outliers)\n"
           "  minmax           the largest |x| seen (nothing clips)\n"
           "  percentile:P     the |x| below which P% of the values lie, e.g. percentile:99.99\n"
           "The cache is a text file: a header naming the model's fingerprint and the method,\n"
           "then 'TENSOR SCALE' per line. Every prompt line is checked before anything runs.\n"
           "Example:\n"
           "  kiln calibrate --plan t5.plan --calib calib.jsonl -o t5.calib");
  cmd->add_option("--plan", o->plan, "float plan (fp32, fp16 or bf16)")->required();
  one_value(cmd->add_option("--calib", o->calib,
                            "JSON lines: a string or {\"text\"|\"prompt\": ...} per line")
                ->required());
  one_value(cmd->add_option("-o,--output", o->output, "calibration cache to write")->required());
  one_value(cmd->add_option("--calib-method", o->method,
                            "entropy, minmax or percentile:P (default entropy)"));
  in_range(cmd->add_option("--calib-batch", o->batch, "prompts run together (default 8)"), 1, 4096);
  in_range(cmd->add_option("--calib-tokens", o->new_tokens,
                           "greedy tokens generated per prompt (default 8)"),
           1, 1024);
  return [o](const GlobalOptions& g) {
    const CalibrationMethodSpec method = parse_calibration_method(o->method);
    check_plan_file(o->plan, "--plan");
    AtomicFileWriter::check_target(o->output, "-o");
    const std::vector<CalibrationPrompt> prompts = read_calibration_prompts(o->calib);
    auto ctx = make_context(g);
    auto engine = open_engine(*ctx, o->plan, "");
    CalibrationRunOptions options;
    options.batch = o->batch;
    options.new_tokens = o->new_tokens;
    const ActivationStats stats = collect_activation_stats(*engine, prompts, options);
    const CalibrationCache cache = calibrate_model(engine->model(), stats, method);
    write_calibration_cache(o->output, cache);
    ctx->log().info(
        "wrote {}: {} scales ({}), model {}; {} prompts, {} prompt tokens, {} "
        "generated tokens",
        o->output, cache.scales.size(), cache.method, cache.model, stats.prompts,
        stats.prompt_tokens, stats.generated_tokens);
    return 0;
  };
}

}  // namespace kiln::cli
