#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/backend.h"
#include "builder/calibration_runner.h"
#include "builder/sensitivity.h"
#include "commands.h"
#include "frontend/onnx/onnx_frontend.h"
#include "io/atomic_file.h"
#include "plan/plan.h"

namespace kiln::cli {

// Longest prompt a plan may be built for: far beyond both model families' positions, small
// enough that the largest workspace bucket stays allocatable.
inline constexpr int64_t kMaxInputTokensLimit = 65536;

namespace {

namespace fs = std::filesystem;

struct FileId {
  dev_t dev;
  ino_t ino;
  bool operator==(const FileId&) const = default;
};

std::optional<FileId> file_id(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

fs::path parent_of(const fs::path& path) {
  const fs::path parent = path.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// Every file of `model_dir` that a build reads or would read: the configs, the tokenizer files,
// model.safetensors, the index and the shards it names (existing or not: a plan written there
// would become part of the checkpoint), and the files hashed into the plan's metadata (every
// .json and .safetensors of the directory, spiece.model).
std::vector<fs::path> files_a_build_reads(const fs::path& model_dir) {
  std::vector<fs::path> files;
  for (const char* name :
       {"config.json", "generation_config.json", "spiece.model", "tokenizer.json",
        "tokenizer_config.json", "model.safetensors", "model.safetensors.index.json"})
    files.push_back(model_dir / name);
  std::ifstream index(model_dir / "model.safetensors.index.json");
  if (index) {
    // A damaged index is the build's to report; here it only names files.
    const nlohmann::json doc = nlohmann::json::parse(index, nullptr, /*allow_exceptions=*/false);
    if (doc.is_object() && doc.contains("weight_map") && doc["weight_map"].is_object())
      for (const auto& [tensor, shard] : doc["weight_map"].items())
        if (shard.is_string()) files.push_back(model_dir / shard.get<std::string>());
  }
  std::error_code ec;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.ends_with(".json") || name.ends_with(".safetensors")) files.push_back(it->path());
  }
  return files;
}

// A plan written over a file the build reads would destroy the checkpoint (`kiln build --model
// ow -o ow/model.safetensors`): refused, whether -o names that file (in the model directory, by
// any path to it) or is the same file under another name (a hard or symbolic link).
void check_output_is_not_an_input(const std::string& output, const std::string& model_dir) {
  const fs::path out(output);
  const std::optional<FileId> out_id = file_id(out);
  const std::optional<FileId> out_parent = file_id(parent_of(out));
  const std::optional<FileId> model_id = file_id(model_dir);
  const std::string name = out.filename().string();
  for (const fs::path& input : files_a_build_reads(model_dir)) {
    const std::optional<FileId> input_id = file_id(input);
    const bool same_file = out_id && input_id && *out_id == *input_id;
    const bool same_entry =
        out_parent && *out_parent == file_id(parent_of(input)) && name == input.filename().string();
    KILN_CHECK_USAGE(!same_file && !same_entry,
                     "-o {}: this is {}, which the build reads from --model {}; writing the plan "
                     "there would destroy the checkpoint. Give the plan its own file name, e.g. "
                     "-o {}.plan",
                     output, input.string(), model_dir,
                     fs::path(model_dir).lexically_normal().filename().empty()
                         ? std::string("model")
                         : fs::path(model_dir).lexically_normal().filename().string());
  }
  // A new .json or .safetensors file in the model directory would be read by later builds.
  KILN_CHECK_USAGE(
      !(out_parent && model_id && *out_parent == *model_id &&
        (name.ends_with(".json") || name.ends_with(".safetensors"))),
      "-o {}: a .json or .safetensors file in the checkpoint directory --model {} would be read "
      "as part of the checkpoint by later builds; give the plan a name ending in .plan",
      output, model_dir);
}

}  // namespace

Runner add_build(CLI::App& app) {
  struct Opts {
    std::string model, tokenizer, output, device = "cpu", precision = "fp32", prompt_template;
    std::string kv_cache = "auto";
    std::vector<std::string> profiles, onnx;
    std::string calib, calib_cache, calib_method = "entropy", quant_tolerance;
    int calib_batch = 8;
    int sensitivity_prompts = kDefaultSensitivityPrompts;
    double smoothquant = 0.0;
    int64_t calib_tokens = 8;
    int64_t max_input_tokens = 0, max_step_tokens = 0;
    bool tf32 = false, no_tune = false, awq = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd =
      app.add_subcommand("build", "Compile a HuggingFace checkpoint or an ONNX export into a plan");
  describe(
      cmd,
      "Import → passes (constant folding, dead-code elimination, fusions, memory planning) →\n"
      "one versioned, mmap-able file. -o is checked before any work, and nothing is left\n"
      "behind when the build fails.\n"
      "Examples:\n"
      "  kiln build --model models/t5-tiny -o t5.plan\n"
      "  kiln build --model models/bloom-tiny --prompt-template \"{prompt} =\" -o bloom.plan\n"
      "  kiln build --model models/t5-tiny --precision bf16 -o t5-bf16.plan\n"
      "  kiln build --onnx bloom.onnx --tokenizer models/bloom-tiny/tokenizer.json "
      "-o bloom-onnx.plan\n"
      "  kiln build --onnx t5_encoder.onnx --onnx t5_decoder.onnx "
      "--tokenizer models/t5-tiny/spiece.model -o t5-onnx.plan\n"
      "  kiln build --model models/bloom-tiny --device cuda --precision fp16 -o bloom-gpu.plan\n"
      "  kiln build --model models/bloom-tiny --device cuda --precision fp16 --kv-cache fp8 "
      "-o bloom-gpu-kv8.plan\n"
      "  kiln build --model models/t5-tiny --precision int8 --calib calib.jsonl --calib-cache "
      "t5.calib -o t5-w8a8.plan\n"
      "  kiln build --model models/t5-tiny --precision int8 --calib-cache t5.calib -o "
      "t5-w8a8.plan\n"
      "  kiln build --model models/t5-tiny --precision int8 --calib calib.jsonl "
      "--quant-tolerance 1e-4 -o t5-w8a8.plan\n"
      "int8 (W8A8, cpu and cuda) quantizes every Linear's input to int8 with a static scale "
      "calibrated on\n"
      "--calib prompts: the fp32 model runs over them first (encoder and decoder, decoding\n"
      "--calib-tokens tokens greedily) and records each input's range; --calib-cache writes\n"
      "those scales, and given alone rebuilds from them without running the prompts.\n"
      "--smoothquant ALPHA first migrates outlier channels of the norms' outputs into the\n"
      "Linear weights (SmoothQuant, folded into the norms), then calibrates the smoothed model.\n"
      "Then the sensitivity fallback measures each quantized layer alone against fp32 on\n"
      "--sensitivity-prompts prompts (mean KL of the next-token distributions, top-1\n"
      "agreement) and keeps the worst layers float until the whole plan's mean KL is at most\n"
      "--quant-tolerance; the log and `kiln inspect --layers` say which and why, and the cache\n"
      "records them for cache-only rebuilds.\n"
      "fp8 (cuda, sm_89+) takes the same calibration and cache: E4M3 weights, and each input's\n"
      "scale its threshold over 448. A cuda build calibrates and measures its layers on the\n"
      "CPU's fp32 and int8 models (no GPU needed to build).\n"
      "On a GPU, a cuda build times each Linear's kernel variants (kiln's GEMV, cuBLASLt's\n"
      "algorithms) at the plan's row counts and stores the fastest (--no-tune skips it).");
  cmd->add_option("--model", o->model,
                  "HuggingFace checkpoint directory (config.json, "
                  "model.safetensors or sharded index, tokenizer)");
  cmd->add_option("--onnx", o->onnx,
                  "instead of --model: an ONNX export that lifts into a generation plan: a BLOOM "
                  "causal LM file, or a T5 encoder and decoder (--onnx twice, or a folder with "
                  "optimum's encoder_model.onnx and decoder_model.onnx). `kiln inspect --onnx` "
                  "shows what lifts");
  one_value(cmd->add_option("--tokenizer", o->tokenizer,
                            "with --onnx: tokenizer.json (BLOOM) or spiece.model (T5), which ONNX "
                            "files do not carry"));
  cmd->add_option("-o,--output", o->output, "plan file to write")->required();
  cmd->add_option("--device", o->device, "cpu or cuda (a cuda plan runs where a GPU is visible)")
      ->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "cpu: fp32, bf16, fp16, int8-weight or int4-weight (weight storage, int4 in "
                  "groups of 128 inputs; activations, norms and accumulation stay fp32), or int8 "
                  "(W8A8: int8 weights and calibrated int8 "
                  "Linear inputs; needs --calib or --calib-cache). cuda: fp32, fp16 or bf16 "
                  "(weights and activations; fp32 accumulation), int8-weight or int4-weight "
                  "(quantized weights, fp16 activations), int8 (W8A8 with fp16 activations; "
                  "calibrated on the cpu) or fp8 (E4M3 weights and calibrated E4M3 Linear "
                  "inputs; sm_89+ GPUs)")
      ->capture_default_str();
  cmd->add_option("--kv-cache", o->kv_cache,
                  "what the KV cache stores: auto (the attention's type: fp32, fp16 or bf16; "
                  "bf16 for the cpu's narrow plans) or fp8 (cuda: E4M3 keys and values with a "
                  "scale of 1, saturating at +-448; half an fp16 cache's bytes, so twice the "
                  "tokens fit and long decodes read half)")
      ->capture_default_str();
  cmd->add_option("--prompt-template", o->prompt_template,
                  "default template stored in the plan: every {prompt} is replaced by the "
                  "prompt, e.g. \"{prompt} =\"");
  in_range(cmd->add_option("--max-input-tokens", o->max_input_tokens,
                           "longest prompt the plan accepts (default: the model's positions, T5 "
                           "512, BLOOM 2048)"),
           1, kMaxInputTokensLimit);
  in_range(cmd->add_option("--max-step-tokens", o->max_step_tokens,
                           "most tokens one step runs: prompts prefill together up to this many "
                           "(default: the longest prompt or 256, and 4096 on cuda; never below "
                           "the longest prompt). Activation workspaces are sized for it"),
           1, 1 << 20);
  cmd->add_flag("--tf32", o->tf32,
                "cuda fp32 plans: let GEMMs use TF32 tensor cores (faster prefill, about 1e-3 "
                "relative error instead of fp32's 1e-6)");
  cmd->add_flag("--no-tune", o->no_tune,
                "cuda plans: skip timing kernel variants on this GPU (faster build; kernels are "
                "then chosen by heuristics when the plan loads)");
  one_value(cmd->add_option("--profile", o->profiles, "shape profiles (not built yet)"));
  one_value(cmd->add_option("--calib", o->calib,
                            "--precision int8 or fp8: calibration prompts, JSON lines (a string or "
                            "{\"text\"|\"prompt\": ...} per line); a few hundred representative "
                            "ones"));
  one_value(cmd->add_option("--calib-method", o->calib_method,
                            "with --calib: entropy (TensorRT's KL threshold, default), minmax or "
                            "percentile:P (e.g. percentile:99.99)"));
  one_value(
      cmd->add_option("--calib-cache", o->calib_cache,
                      "--precision int8 or fp8: with --calib, write the calibrated scales here; "
                      "alone, build from this cache without running calibration (a cache "
                      "made for another model is refused)"));
  in_range(cmd->add_option("--calib-batch", o->calib_batch,
                           "with --calib: prompts run together (default 8)"),
           1, 4096);
  cmd->add_flag("--awq", o->awq,
                fmt::format("--precision int4-weight with --calib: AWQ's activation-aware scale "
                            "search: each int4 Linear input's salient channels get finer weight "
                            "levels (per input tensor, the scale exponent of least output error "
                            "on {} sampled rows; folded into the norm before it)",
                            kAwqSampleRows));
  cmd->add_option("--smoothquant", o->smoothquant,
                  "with --calib: SmoothQuant's alpha in (0, 1] (0.5 a good start for BLOOM): each "
                  "norm-fed Linear input's outlier channels migrate into the weights before "
                  "quantizing (the cache records the factors)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option(
         "--quant-tolerance", o->quant_tolerance,
         fmt::format(
             "with --calib: the most mean KL divergence (nats per token) of the int8 plan's "
             "next-token distributions from fp32's on the calibration prompts; the layers "
             "that cause most of it are kept float until the plan is under it (default "
             "{:g}; 0 keeps float every layer whose error is measurable; 'off': every "
             "layer int8, no sensitivity pass). With --calib-cache alone: the cache's "
             "layers are kept, or 'off' drops them",
             kDefaultQuantTolerance))
      ->type_name("KL|off");
  CLI::Option* sensitivity_prompts = cmd->add_option(
      "--sensitivity-prompts", o->sensitivity_prompts,
      fmt::format("with --calib: how many of the calibration prompts (the first) the "
                  "sensitivity fallback scores each quantized layer on (default {})",
                  kDefaultSensitivityPrompts));
  in_range(cmd->add_option("--calib-tokens", o->calib_tokens,
                           "with --calib: greedy tokens generated per prompt, so that decode "
                           "steps are calibrated too (default 8)"),
           1, 1024);
  return [o, sensitivity_prompts](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->model.empty() != o->onnx.empty(),
                     "give either --model HF_DIR or --onnx FILE (not both)");
    KILN_CHECK_USAGE(o->tokenizer.empty() || !o->onnx.empty(),
                     "--tokenizer is for --onnx builds (a --model directory has its own)");
    KILN_CHECK_USAGE(o->profiles.empty(), "--profile: shape profiles are not built yet");
    BuildOptions bo;
    KILN_CHECK_USAGE(parse_device(o->device, &bo.device), "--device {}: unknown device (known: {})",
                     o->device, device_names());
    KILN_CHECK_USAGE(parse_precision(o->precision, &bo.precision),
                     "--precision {}: unknown precision (known: {})", o->precision,
                     precision_names());
    const std::string why = target_unsupported_reason(bo.device, bo.precision);
    KILN_CHECK_USAGE(why.empty(), "--device {} --precision {}: {}", o->device, o->precision, why);
    KILN_CHECK_USAGE(parse_kv_cache(o->kv_cache, &bo.kv_cache),
                     "--kv-cache {}: unknown KV cache type (known: auto, fp8)", o->kv_cache);
    const std::string_view kv_why = kv_cache_refusal(bo.device, bo.kv_cache);
    KILN_CHECK_USAGE(kv_why.empty(), "--device {} --kv-cache {}: {}", o->device, o->kv_cache,
                     kv_why);
    KILN_CHECK_USAGE(
        o->prompt_template.empty() || o->prompt_template.find("{prompt}") != std::string::npos,
        "--prompt-template '{}': the template must contain {{prompt}} (where the "
        "prompt goes), e.g. \"{{prompt}} =\"",
        o->prompt_template);
    // Calibration: only for precisions that quantize Linear inputs, every file checked before
    // anything is built (prompts line by line, a cache read and parsed).
    const bool calibrated = precision_support(bo.device, bo.precision).calibrated_inputs;
    KILN_CHECK_USAGE(!o->awq || bo.precision == Precision::kInt4Weight,
                     "--awq searches the scales of int4-weight plans; this build is --precision {}",
                     o->precision);
    KILN_CHECK_USAGE(!o->awq || !o->calib.empty() || !o->calib_cache.empty(),
                     "--awq measures activations: give --calib FILE.jsonl (a few hundred "
                     "representative prompts), or --calib-cache FILE written by an earlier "
                     "--awq build");
    KILN_CHECK_USAGE(o->awq || bo.precision != Precision::kInt4Weight || o->calib_cache.empty(),
                     "--calib-cache with --precision int4-weight holds AWQ's scales: add --awq");
    KILN_CHECK_USAGE(!o->awq || o->smoothquant == 0.0,
                     "--smoothquant is for int8 (W8A8) plans; --awq makes int4-weight plans' "
                     "scales");
    KILN_CHECK_USAGE(calibrated || o->awq || (o->calib.empty() && o->calib_cache.empty()),
                     "--calib and --calib-cache calibrate int8 (W8A8) plans (and --calib feeds "
                     "int4-weight's --awq); --precision {} quantizes no activations and takes "
                     "no calibration",
                     o->precision);
    KILN_CHECK_USAGE(o->smoothquant == 0.0 || !o->calib.empty(),
                     "--smoothquant {} smooths while calibrating: give --calib FILE.jsonl too (a "
                     "cache made with --smoothquant carries its factors to --calib-cache builds)",
                     o->smoothquant);
    // The sensitivity fallback: on by default with --calib; with a cache alone, the cache's.
    const bool tolerance_given = !o->quant_tolerance.empty();
    const bool prompts_given = sensitivity_prompts->count() > 0;
    KILN_CHECK_USAGE(calibrated || (!tolerance_given && !prompts_given),
                     "--quant-tolerance and --sensitivity-prompts choose which layers of an int8 "
                     "(W8A8) plan stay float; --precision {} quantizes no activations",
                     o->precision);
    std::optional<double> tolerance = kDefaultQuantTolerance;
    if (tolerance_given) tolerance = parse_quant_tolerance(o->quant_tolerance);
    SensitivityOptions sensitivity;
    sensitivity.prompts = o->sensitivity_prompts;
    sensitivity.new_tokens = o->calib_tokens;
    if (tolerance) {
      sensitivity.tolerance = *tolerance;
      check_sensitivity_options(sensitivity);
    }
    KILN_CHECK_USAGE(!prompts_given || !o->calib.empty(),
                     "--sensitivity-prompts {} scores calibration prompts: give --calib "
                     "FILE.jsonl too (a cache-only build keeps the layers its cache records)",
                     o->sensitivity_prompts);
    const CalibrationMethodSpec method = parse_calibration_method(o->calib_method);
    std::vector<CalibrationPrompt> prompts;
    if (!o->calib.empty()) prompts = read_calibration_prompts(o->calib);
    if (o->awq && !o->calib_cache.empty() && o->calib.empty()) {
      CalibrationCache cache = read_calibration_cache(o->calib_cache);
      KILN_CHECK_USAGE(cache.awq(),
                       "--calib-cache {}: this cache holds int8 (W8A8) input scales (method {}), "
                       "not AWQ's; make one with --awq --calib FILE.jsonl --calib-cache {}",
                       o->calib_cache, cache.method, o->calib_cache);
      bo.precision_options.smoothing = std::move(cache.smoothing);
      bo.precision_options.smoothing_model = cache.model;
      bo.precision_options.smoothing_source = "calibration cache " + o->calib_cache;
    } else if (!o->calib_cache.empty()) {
      if (o->calib.empty()) {
        bo.precision_options.calibration = read_calibration_cache(o->calib_cache);
        KILN_CHECK_USAGE(!bo.precision_options.calibration->awq(),
                         "--calib-cache {}: this cache holds AWQ's scales for int4-weight plans "
                         "(--awq), not int8 input scales; calibrate with --calib FILE.jsonl",
                         o->calib_cache);
        bo.precision_options.calibration_source = o->calib_cache;
        CalibrationCache& cache = *bo.precision_options.calibration;
        if (tolerance_given && !tolerance) {
          cache.fallback.clear();
          cache.quant_tolerance = -1.0;
        } else if (tolerance_given) {
          KILN_CHECK_USAGE(
              cache.quant_tolerance == *tolerance,
              "--quant-tolerance {}: the cache {} was made with {}; measuring the layers again "
              "needs the calibration prompts: give --calib FILE.jsonl too (or leave "
              "--quant-tolerance out to keep the cache's layers, or 'off' for none)",
              o->quant_tolerance, o->calib_cache,
              cache.quant_tolerance < 0.0
                  ? std::string("no sensitivity fallback")
                  : fmt::format("--quant-tolerance {:g}", cache.quant_tolerance));
        }
      } else {
        AtomicFileWriter::check_target(o->calib_cache, "--calib-cache");
      }
    }
    std::vector<std::string> onnx_files;
    if (o->onnx.empty()) {
      check_model_dir(o->model, "--model");
    } else {
      onnx_files = resolve_onnx_sources(o->onnx);
      KILN_CHECK_USAGE(!o->tokenizer.empty(),
                       "--onnx: ONNX files carry no tokenizer: give --tokenizer tokenizer.json "
                       "(BLOOM) or --tokenizer spiece.model (T5)");
      check_input_file(o->tokenizer, "--tokenizer");
    }
    AtomicFileWriter::check_target(o->output, "-o");
    if (o->onnx.empty()) {
      check_output_is_not_an_input(o->output, o->model);
    } else {
      std::vector<std::string> inputs = onnx_files;
      inputs.push_back(o->tokenizer);
      for (const std::string& input : inputs) {
        const std::optional<FileId> in = file_id(input), out = file_id(o->output);
        KILN_CHECK_USAGE(!(in && out && *in == *out),
                         "-o {}: this is {}, which the build reads; give the plan its own file",
                         o->output, input);
      }
    }
    const ModelSource model_source =
        o->onnx.empty() ? ModelSource(o->model) : ModelSource::onnx(onnx_files, o->tokenizer);
    const std::string source = model_source.label();
    GlobalOptions gl = g;
    auto ctx = make_context(gl);
    // Building is the step users watch: say what happened even without -v.
    if (!g.quiet && ctx->log().level() > LogLevel::kInfo) ctx->log().set_level(LogLevel::kInfo);
    const auto t0 = std::chrono::steady_clock::now();
    if (!o->prompt_template.empty()) bo.prompt_template = o->prompt_template;
    bo.max_input_tokens = o->max_input_tokens;
    bo.tf32 = o->tf32;
    bo.max_step_tokens = o->max_step_tokens;
    // Weights packed for this machine's kernels (KILN_CPU_ISA=avx2 builds a plain plan that
    // runs on any x86-64-v3 CPU).
    bo.pack_for_cpu = ctx->cpu_isa();
    // The weights the passes make wait in a temporary file beside the plan (it needs that room
    // anyway), not in memory.
    bo.spill_dir = std::filesystem::absolute(o->output).parent_path().string();
    if (o->awq && !o->calib.empty()) {
      CalibrationRunOptions run;
      run.batch = o->calib_batch;
      run.new_tokens = o->calib_tokens;
      run.sample_rows = kAwqSampleRows;
      if (o->calib_method != "entropy")
        ctx->log().warn("--calib-method has no effect with --awq: it sets int8 input scales");
      AwqResult awq = awq_checkpoint(*ctx, model_source, bo, prompts, run);
      if (!o->calib_cache.empty()) {
        CalibrationCache cache;
        cache.model = awq.model;
        cache.method = CalibrationCache::kAwqMethod;
        cache.smoothing = awq.factors;
        write_calibration_cache(o->calib_cache, cache);
        ctx->log().info("wrote calibration cache {} (AWQ: {} scaled tensors)", o->calib_cache,
                        cache.smoothing.size());
      }
      bo.precision_options.smoothing = std::move(awq.factors);
    } else if (o->awq) {
      ctx->log().info("awq: {} scaled tensors from {}, no prompts run",
                      bo.precision_options.smoothing.size(), o->calib_cache);
    } else if (!o->calib.empty()) {
      CalibrationRunOptions run;
      run.batch = o->calib_batch;
      run.new_tokens = o->calib_tokens;
      // Its own status lines: building the fp32 model, then the prompts' progress.
      CalibrationCache cache = calibrate_checkpoint(*ctx, model_source, bo, prompts, run, method,
                                                    nullptr, o->smoothquant);
      if (tolerance) {
        BuildOptions measured = bo;
        measured.precision_options.calibration = std::move(cache);
        measured.precision_options.calibration_source = "--calib " + o->calib;
        cache = apply_sensitivity_fallback(*ctx, model_source, measured, prompts, sensitivity);
      } else {
        ctx->log().info("sensitivity fallback off (--quant-tolerance off): every layer int8");
      }
      if (!o->calib_cache.empty()) {
        write_calibration_cache(o->calib_cache, cache);
        ctx->log().info("wrote calibration cache {} ({} scales, {})", o->calib_cache,
                        cache.scales.size(), cache.method);
      }
      bo.precision_options.calibration = std::move(cache);
      bo.precision_options.calibration_source = "--calib " + o->calib;
    } else if (bo.precision_options.calibration) {
      if (o->calib_method != "entropy")
        ctx->log().warn(
            "--calib-method has no effect without --calib: the cache {} was made "
            "with {}",
            o->calib_cache, bo.precision_options.calibration->method);
      const CalibrationCache& cache = *bo.precision_options.calibration;
      ctx->log().info("calibration: {} scales from {} ({}), no prompts run", cache.scales.size(),
                      o->calib_cache, cache.method);
      if (cache.quant_tolerance >= 0.0)
        ctx->log().info(
            "sensitivity fallback from {}: {} layers kept float (measured under "
            "--quant-tolerance {:g}; kiln inspect --layers says why)",
            o->calib_cache, cache.fallback.size(), cache.quant_tolerance);
    }
    ModelIR model;
    {
      Activity activity(ctx->log(), "building " + source);
      model = build_model(model_source, bo, ctx->log());
    }
    if (o->no_tune && bo.device != Device::kCuda)
      ctx->log().warn("--no-tune has no effect: only cuda builds time kernel variants");
    if (bo.device == Device::kCuda && !o->no_tune) {
      Activity activity(ctx->log(), "timing kernel variants on the GPU");
      select_tactics(model, *ctx);
    }
    PlanBuildInfo info;
    info.source = source;
    if (o->onnx.empty()) {
      for (const auto& e : std::filesystem::directory_iterator(o->model)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".safetensors") || name.ends_with(".json") || name == "spiece.model")
          info.source_files.push_back(e.path().string());
      }
    } else {
      info.source_files = onnx_files;
      info.source_files.push_back(o->tokenizer);
    }
    std::sort(info.source_files.begin(), info.source_files.end());
    {
      Activity activity(ctx->log(), "writing " + o->output);
      write_plan(o->output, model, info, ctx->log());
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    ctx->log().info("build finished in {:.2f} s, peak resident memory {:.2f} GiB", secs,
                    static_cast<double>(usage.ru_maxrss) / (1 << 20));
    return 0;
  };
}

}  // namespace kiln::cli
