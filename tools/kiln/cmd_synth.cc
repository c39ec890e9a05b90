#include <algorithm>
#include <filesystem>

#include "commands.h"
#include "frontend/hf/synth.h"
#include "io/atomic_file.h"
#include "output.h"

namespace kiln::cli {

Runner add_synth(CLI::App& app) {
  struct Opts {
    std::string preset, output, dtype = "fp32";
    uint64_t seed = 0;
    bool list = false, force = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "synth", "Write a real-size HuggingFace checkpoint with random weights (speed/memory work)");
  describe(
      cmd,
      "The public models' exact shapes and the fixture models' tokenizers, without downloads.\n"
      "HuggingFace transformers loads it as is, so kiln and HF can run the same weights. The\n"
      "text such a model generates is meaningless. Progress goes to standard error, the\n"
      "summary line to standard output. The directory appears all at once: the files are\n"
      "written into DIR.partial.PID beside it and renamed to DIR when complete (Ctrl-C or a\n"
      "failure removes it; only a killed kiln leaves it behind). An existing non-empty DIR is\n"
      "refused unless --force is given, which replaces it whole.\n"
      "Examples:\n"
      "  kiln synth --list\n"
      "  kiln synth --preset flan-t5-small -o /tmp/flan-t5-small\n"
      "  kiln synth --preset bloom-560m --dtype fp16 -o /tmp/bloom-560m --seed 1");
  cmd->add_option("--preset", o->preset, "model shape (see --list)");
  cmd->add_option("-o,--output", o->output,
                  "directory to write (created with its parents; if it exists, it must be empty)");
  cmd->add_flag("--force", o->force, "replace an existing -o directory and everything in it");
  cmd->add_option("--dtype", o->dtype, "weight dtype: fp32, fp16 or bf16")->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed (same seed, same weights)")
      ->capture_default_str();
  cmd->add_flag("--list", o->list, "list the presets with their shapes and sizes");
  return [o](const GlobalOptions& g) {
    if (o->list) {
      kiln::cli::out("{:<15} {:<6} {:>7} {:>7} {:>6} {:>7} {:>8} {:>12}\n", "preset", "family",
                     "hidden", "ffn", "heads", "layers", "vocab", "parameters");
      for (const SynthPreset& p : synth_presets())
        kiln::cli::out("{:<15} {:<6} {:>7} {:>7} {:>6} {:>7} {:>8} {:>11.1f}M\n", p.name, p.family,
                       p.hidden, p.d_ff, p.heads,
                       p.family == "t5" ? fmt::format("{}+{}", p.layers, p.decoder_layers)
                                        : std::to_string(p.layers),
                       p.vocab, static_cast<double>(synth_parameter_count(p)) / 1e6);
      return 0;
    }
    KILN_CHECK_USAGE(!o->preset.empty(), "--preset is required (see `kiln synth --list`)");
    KILN_CHECK_USAGE(!o->output.empty(), "-o DIR is required");
    std::vector<std::string> names;
    for (const SynthPreset& p : synth_presets()) names.push_back(p.name);
    if (std::find(names.begin(), names.end(), o->preset) == names.end()) {
      const std::string guess = closest_name(o->preset, names);
      KILN_FAIL_KIND(ErrorKind::kUsage, "--preset {}: unknown preset{}; the presets are: {}",
                     o->preset, guess.empty() ? "" : " (did you mean " + guess + "?)",
                     fmt::join(names, ", "));
    }
    const SynthPreset& preset = find_synth_preset(o->preset);
    SynthOptions so;
    KILN_CHECK_USAGE(o->dtype == "fp32" || o->dtype == "fp16" || o->dtype == "bf16",
                     "--dtype {}: expected fp32, fp16 or bf16", o->dtype);
    so.dtype = o->dtype == "fp32" ? DType::kF32 : o->dtype == "fp16" ? DType::kF16 : DType::kBF16;
    so.seed = o->seed;
    so.replace_existing = o->force;
    // Before any work (the writer checks again when it starts and when it renames into place).
    if (!o->force) AtomicDirWriter::check_absent_or_empty(o->output, "-o", "--force");
    auto ctx = make_context(g);
    const int64_t params = synth_parameter_count(preset);
    const int64_t bytes = static_cast<int64_t>(dtype_bytes(so.dtype, static_cast<size_t>(params)));
    ctx->log().info("synth {}: {:.1f}M parameters, {:.2f} GiB of {} weights → {}", preset.name,
                    static_cast<double>(params) / 1e6, static_cast<double>(bytes) / (1 << 30),
                    o->dtype, o->output);
    Progress progress(ctx->log(), "writing " + preset.name, bytes >> 20);
    int64_t shown = 0;
    synthesize_checkpoint(preset, o->output, so, [&](int64_t done, int64_t) {
      const int64_t mib = done >> 20;
      if (mib > shown) {
        progress.advance(mib - shown);
        shown = mib;
      }
    });
    progress.done();
    kiln::cli::out("wrote {} ({:.1f}M parameters, {:.2f} GiB)\n", o->output,
                   static_cast<double>(params) / 1e6, static_cast<double>(bytes) / (1 << 30));
    return 0;
  };
}

}  // namespace kiln::cli
