// kiln bench: latency, throughput and % of the memory-bandwidth roofline of a plan, with the
// machine's bandwidth measured in the same run.
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "backend/cuda_info.h"
#include "commands.h"
#include "core/bandwidth.h"
#include "devices.h"
#include "output.h"
#include "runtime/scheduler.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Resets the process's resident high-water mark (Linux's VmHWM) to its current size, so that a
// configuration's peak leaves out what ran before it (the bandwidth probe's 1 GiB buffer). False
// where that is not there (no /proc/self/clear_refs, or it refused the write).
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good();
}
// VmHWM: the peak since the last reset; getrusage's lifetime peak where /proc has no VmHWM.
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "  123 kB"
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Bytes of every weight of the plan's graphs at its stored dtype, a tensor shared by two graphs
// (T5's embedding) once.
int64_t plan_weight_bytes(const ModelIR& ir) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const Graph& g : ir.graphs)
    for (const Value& v : g.values)
      if (v.kind == ValueKind::kWeight && v.data.defined() && seen.insert(v.data.raw()).second)
        bytes += static_cast<int64_t>(v.data.nbytes());
  return bytes;
}

// Prompts of exactly `len` tokens made of the tokenizer's own ids (so they are valid for it).
std::vector<int64_t> bench_prompt(const CompiledModel& m, int64_t len) {
  std::vector<int64_t> base =
      m.tokenizer().encode("reverse: suvogi add: 456 + 95 sort: f r t d e upper: lubu copy: vica");
  const auto& eos = m.desc().eos_token_ids;
  const int64_t vocab = m.desc().vocab_size;
  // A tokenizer larger than the model's vocabulary (a plan built from an ONNX export with
  // another model's tokenizer) may give ids the model has no row for: those are left out, and
  // with nothing left the prompt counts up through the model's own ids.
  std::erase_if(base, [&](int64_t id) {
    return id < 0 || id >= vocab || std::find(eos.begin(), eos.end(), id) != eos.end();
  });
  for (int64_t id = 3; base.empty() && id < vocab; ++id)
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) base.push_back(id);
  KILN_CHECK_USAGE(!base.empty(), "the plan's vocabulary of {} ids has none to make a prompt of",
                   vocab);
  std::vector<int64_t> ids;
  while (static_cast<int64_t>(ids.size()) < len) ids.push_back(base[ids.size() % base.size()]);
  return ids;
}

// What one decode step reads of a graph's weights, at their stored dtypes: `streamed` bytes
// read whole (Linear weights and scales, norms, biases), and `gathered_row` bytes per sequence
// for tables (and their row scales) read only by Embedding: one row per token.
struct DecodeWeightBytes {
  int64_t streamed = 0;
  int64_t gathered_row = 0;
};
DecodeWeightBytes decode_weight_bytes(const Graph& g) {
  std::vector<bool> gathered_only(g.values.size(), true), read(g.values.size(), false);
  for (const Node& n : g.nodes)
    for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
      const int id = n.inputs[slot];
      if (id < 0) continue;
      read[id] = true;
      if (n.op != OpKind::kEmbedding) gathered_only[id] = false;  // table and its row scales
    }
  DecodeWeightBytes b;
  for (size_t id = 0; id < g.values.size(); ++id) {
    const Value& v = g.values[id];
    if (v.kind != ValueKind::kWeight || !read[id]) continue;
    const auto bytes = static_cast<int64_t>(v.data.nbytes());
    if (gathered_only[id])
      b.gathered_row += bytes / v.data.dim(0);
    else
      b.streamed += bytes;
  }
  return b;
}

// The Linears of a prompt step of `batch` prompts of `len` tokens, as (rows, in, out) -> how
// many: the encoder's at batch x len rows; the decoder's at the step's tokens (batch x len, or
// batch for an encoder-decoder's first decoder step) or, past the gather of the rows that need
// logits (the lm_head), at batch rows.
using LinearShape = std::array<int64_t, 3>;
std::map<LinearShape, int> prompt_linears(const ModelIR& ir, int64_t batch, int64_t len) {
  std::map<LinearShape, int> shapes;
  auto add = [&](const Graph& g, int64_t tokens) {
    const std::map<std::string, int64_t> bindings = {{"tokens", tokens}, {"rows", batch}};
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kLinear) continue;
      const Shape x = resolve_shape(g.values[n.inputs[0]].shape, bindings);
      const Shape y = resolve_shape(g.values[n.outputs[0]].shape, bindings);
      ++shapes[{shape_numel(y) / y.back(), x.back(), y.back()}];
    }
  };
  if (ir.desc.encoder_decoder) {
    add(ir.graph(kEncoderGraph), batch * len);
    add(ir.graph(kDecoderGraph), batch);
  } else {
    add(ir.graph(kDecoderGraph), batch * len);
  }
  return shapes;
}

struct RunTimes {
  double ttft_ms = 0, total_ms = 0;
};

// One run of `batch` requests on `s`, which the warm-up and the measured runs of a batch size
// share, as a server's requests share its scheduler: its KV cache (host pages already faulted
// in, device memory already allocated) and its captured CUDA graphs stay warm between runs.
RunTimes run_once(Scheduler& s, int batch, const std::vector<int64_t>& prompt, int64_t new_tokens) {
  GenerationParams p;
  p.max_new_tokens = new_tokens;
  p.ignore_eos = true;
  const auto t0 = Clock::now();
  for (int i = 0; i < batch; ++i) s.submit(prompt, p);
  RunTimes t;
  int first = 0, done = 0;
  while (done < batch) {
    for (const GenerationEvent& e : s.step()) {
      KILN_CHECK(e.error.empty(), "bench request failed: {}", e.error);
      if (!e.new_tokens.empty() && ++first == batch) t.ttft_ms = ms_since(t0);
      done += e.finished;
    }
  }
  t.total_ms = ms_since(t0);
  return t;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  struct Opts {
    std::string plan, sweep;
    int batch = 1, warmup = 1, runs = 3;
    int64_t input_len = 78, output_len = 100;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure a plan: latency, tokens/s, peak memory and % of the memory roofline");
  describe(
      cmd,
      "Reports load time, time to first token, per-token decode latency, decode and\n"
      "prefill tokens/s, peak memory, and % of the memory-bandwidth roofline (bytes read per\n"
      "decode step / step time / the machine's read bandwidth, measured here by kiln). On the\n"
      "CPU also the prompt step against oneDNN: oneDNN's matmul timed on the prompt's Linear\n"
      "shapes in the same run (bf16 for bf16 plans, u8 x s8 for int8-weight and int8 plans, f32\n"
      "otherwise), and that time as a % of the\n"
      "time to first token (100 %: the whole prefill takes what oneDNN's GEMMs alone take).\n"
      "Prompts of --input-len tokens; exactly --output-len new tokens (EOS ignored). The\n"
      "warm-up and the timed runs of a batch size share one scheduler, as a server's requests\n"
      "do: its KV cache and captured CUDA graphs stay warm between runs.\n"
      "Examples:\n"
      "  kiln bench --plan t5.plan\n"
      "  kiln bench --plan bloom.plan --input-len 78 --output-len 100 --sweep batch=1,4,16 --json");
  cmd->add_option("--plan", o->plan, "plan file")->required();
  CLI::Option* batch_opt =
      cmd->add_option("--batch", o->batch, "sequences generated together (1..the plan's batch)")
          ->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "prompt tokens")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "new tokens per sequence (>= 2)")
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed runs first")->capture_default_str();
  cmd->add_option("--runs", o->runs, "timed runs; the median is reported")->capture_default_str();
  cmd->add_option("--sweep", o->sweep,
                  "batch=1,4,16,64: one configuration per batch size (instead of --batch)");
  cmd->add_flag("--json", o->json, "one JSON object per configuration");
  return [o, batch_opt](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->output_len >= 2 && o->output_len <= kMaxNewTokensLimit,
                     "--output-len must be in 2..{}", kMaxNewTokensLimit);
    KILN_CHECK_USAGE(o->input_len >= 1, "--input-len must be positive");
    KILN_CHECK_USAGE(o->runs >= 1 && o->runs <= 100 && o->warmup >= 0 && o->warmup <= 100,
                     "--runs must be in 1..100 and --warmup in 0..100");
    std::vector<int> batches = {o->batch};
    if (!o->sweep.empty()) {
      KILN_CHECK_USAGE(o->sweep.rfind("batch=", 0) == 0,
                       "--sweep takes batch=B1,B2,... (e.g. batch=1,4,16)");
      batches.clear();
      std::string list = o->sweep.substr(6);
      for (size_t pos = 0; pos <= list.size();) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        const std::string item = list.substr(pos, comma - pos);
        char* end = nullptr;
        const long b = std::strtol(item.c_str(), &end, 10);
        KILN_CHECK_USAGE(!item.empty() && *end == '\0' && b >= 1,
                         "--sweep: '{}' is not a batch size", item);
        batches.push_back(static_cast<int>(b));
        pos = comma + 1;
      }
    }
    auto ctx = make_context(g);
    if (!o->sweep.empty() && batch_opt->count() > 0)
      ctx->log().warn("--batch {} has no effect with --sweep {}: the sweep's batch sizes are run",
                      o->batch, o->sweep);
    auto model = CompiledModel::load_plan(*ctx, o->plan);
    // The plan's own load; the backend's making (the CUDA context) is reported apart.
    if (g.verbose)
      ctx->log().info("{} runs with:\n{}", model->backend().describe(),
                      options_text(model->backend().options()));
    const CompiledModel::LoadTimes& lt = model->load_times();
    const double load_ms = lt.plan_ms();
    const ModelIR& ir = model->model();
    KILN_CHECK_USAGE(o->input_len <= ir.profile.max_input_tokens,
                     "--input-len {} exceeds the plan's {} input tokens", o->input_len,
                     ir.profile.max_input_tokens);
    for (int b : batches)
      KILN_CHECK_USAGE(b <= ir.profile.max_batch, "batch {} exceeds the plan's batch of {}", b,
                       ir.profile.max_batch);
    // The roofline: the memory the plan's weights live in. A GPU's bandwidth is a
    // device-to-device copy timed with CUDA events (bytes read + written).
    const bool gpu = ir.device == Device::kCuda;
    BandwidthResult bw;
    if (gpu) {
      ctx->log().info("measuring GPU memory bandwidth (device-to-device copy of 1 GiB)");
      bw.gbps = measure_cuda_bandwidth_gbps();
    } else {
      ctx->log().info("measuring memory read bandwidth ({} threads, 1 GiB)", ctx->pool().size());
      bw = measure_read_bandwidth(ctx->pool());
    }
    // Bytes a decode step reads: every decoder weight once at its stored dtype (the plan's
    // precision), except tables only gathered from (an untied embedding reads one row per
    // sequence), plus each sequence's KV cache (and, encoder-decoder, its cross K/V) at the
    // average context length of the decode phase.
    const DecodeWeightBytes weights = decode_weight_bytes(ir.graph(kDecoderGraph));
    const ModelDesc& d = ir.desc;
    // The KV cache and the cross K/V in the type the backend keeps them in (Scheduler::kv_dtype:
    // the plan's on CUDA; on the CPU bf16 in bf16 and int8-weight plans, f32 otherwise).
    const double avg_ctx = (d.encoder_decoder ? 1.0 : static_cast<double>(o->input_len)) +
                           static_cast<double>(o->output_len) / 2.0;
    // A sequence's KV cache at `positions` (and, encoder-decoder, its cross K/V).
    auto kv_per_seq = [&](DType kv_dtype, double positions) {
      const double row =
          static_cast<double>(dtype_bytes(kv_dtype, static_cast<size_t>(d.cache_row_width())));
      return static_cast<double>(d.cache_layers) * 2.0 *
             (row * positions + (d.encoder_decoder ? row * o->input_len : 0.0));
    };
    // For the memory budget (weights + KV cache + 15 %, issue 8): the plan's weights and the KV
    // cache a sequence has filled by its last token.
    const int64_t weight_bytes = plan_weight_bytes(ir);
    const double filled =
        static_cast<double>(d.encoder_decoder ? o->output_len : o->input_len + o->output_len);
    const std::vector<int64_t> prompt = bench_prompt(*model, o->input_len);
    // On a GPU, what the device held before kiln's allocations (the CUDA context and its loaded
    // kernels, other processes): read after the plan's weights were uploaded and the bandwidth
    // probe's buffers freed, as the device's use minus what kiln's allocations hold. Kernels
    // loaded later (lazily, at their first launch) count as the configurations' own.
    const long long gpu_baseline = gpu ? cuda_memory_used_bytes() - cuda_memory_held_bytes() : 0;
    std::vector<nlohmann::json> rows;
    for (int batch : batches) {
      SchedulerOptions so;
      so.max_batch = batch;
      bool peak_reset = true;
      if (gpu)
        cuda_memory_peak_reset();
      else
        peak_reset = reset_peak_rss();
      Scheduler scheduler(*model, so);
      for (int i = 0; i < o->warmup; ++i) run_once(scheduler, batch, prompt, o->output_len);
      std::vector<double> ttft, decode, total;
      long long gpu_peak = -1;
      Progress progress(ctx->log(), fmt::format("bench batch {}", batch), o->runs);
      for (int i = 0; i < o->runs; ++i) {
        const RunTimes t = run_once(scheduler, batch, prompt, o->output_len);
        ttft.push_back(t.ttft_ms);
        total.push_back(t.total_ms);
        decode.push_back((t.total_ms - t.ttft_ms) / static_cast<double>(o->output_len - 1));
        if (gpu) gpu_peak = std::max(gpu_peak, cuda_memory_peak_bytes());
        progress.advance();
      }
      progress.done();
      const double step_ms = median(decode), ttft_ms = median(ttft);
      const double bytes_per_step = static_cast<double>(weights.streamed) +
                                    static_cast<double>(weights.gathered_row) * batch +
                                    kv_per_seq(scheduler.kv_dtype(), avg_ctx) * batch;
      const double kv_bytes = kv_per_seq(scheduler.kv_dtype(), filled) * batch;
      const int64_t peak = gpu ? static_cast<int64_t>(gpu_peak) : peak_rss_bytes();
      nlohmann::json j{
          {"model", std::filesystem::path(o->plan).filename().string()},
          {"architecture", d.architecture},
          {"precision", precision_name(ir.precision)},
          {"kv_cache", kv_cache_name(ir.kv_cache)},
          {"device", device_name(ir.device)},
          {"batch", batch},
          {"input_len", o->input_len},
          {"output_len", o->output_len},
          {"runs", o->runs},
          {"load_ms", load_ms},
          {"context_ms", lt.context_ms},
          {"load_parts_ms",
           {{"read", lt.read_ms}, {"weights", lt.weights_ms}, {"compile", lt.compile_ms}}},
          {"ttft_ms", ttft_ms},
          {"decode_ms_per_token", step_ms},
          {"tokens_per_s", batch * 1000.0 / step_ms},
          {"prefill_tokens_per_s", batch * static_cast<double>(o->input_len) * 1000.0 / ttft_ms},
          {"total_ms", median(total)},
          {"peak_memory_bytes", peak},
          {"peak_memory_kind",
           gpu ? "gpu (device-wide: in use after each run plus kiln's allocation high-water mark)"
           : peak_reset
               ? "host rss (this configuration's high-water mark)"
               : "host rss (the process's high-water mark: /proc/self/clear_refs is not there)"},
          {"weight_bytes", weight_bytes},
          {"kv_cache_bytes", static_cast<int64_t>(kv_bytes)},
          {"bandwidth_gbps", bw.gbps},
          {"bytes_per_step", static_cast<int64_t>(bytes_per_step)},
          {"roofline_pct", 100.0 * bytes_per_step / (step_ms / 1000.0) / (bw.gbps * 1e9)},
          {"threads", ctx->pool().size()}};
      // How far the peak is above a memory budget, in %.
      const double budget = static_cast<double>(weight_bytes) + kv_bytes;
      auto percent_over = [](double used, double limit) { return 100.0 * (used / limit - 1.0); };
      if (gpu) {
        // Issue 9's budget on a GPU: weights + KV cache + workspace + 10 %, the workspace being
        // the activation arenas of the token buckets run so far and the libraries' (cuBLASLt's)
        // fixed workspace; the peak without the baseline above. What else kiln held at its
        // high-water mark (the allocator's cached blocks, KV chunks not filled, per-request
        // buffers, kernels loaded since) is the excess.
        const int64_t workspace = model->workspace_bytes() + cuda_library_workspace_bytes();
        j["baseline_memory_bytes"] = gpu_baseline;
        j["workspace_bytes"] = workspace;
        j["peak_over_budget_pct"] = percent_over(peak - gpu_baseline, budget + workspace);
      } else {
        // Issue 8's memory budget on the CPU: weights + KV cache + 15 %.
        j["peak_over_weights_kv_pct"] = percent_over(peak, budget);
      }
      rows.push_back(j);
    }
    // Why the prompt step is set against oneDNN's GEMMs of another type than the plan's, or
    // against none (CPU plans; empty when oneDNN ran the plan's own kind).
    std::string onednn_note, onednn_why;
    if (!gpu) {
      // After every configuration ran (the reference's buffers stay out of their peak memory):
      // each distinct Linear shape of the prompt step timed once in oneDNN, in the GEMM of the
      // plan's kind (bf16 for bf16 plans, int8 = u8 x s8 for int8-weight and int8 plans, else f32).
      // A type oneDNN has no implementation of on this CPU (bf16 without AVX-512), or only its
      // reference code, is replaced by f32, and the output says so; should f32 be missing too, the
      // column is n/a. The measured results are printed either way. Empty when every shape was
      // timed in `type`; else why it was not.
      auto reference = [&](LibraryGemmType type) -> std::string {
        const char* name = library_gemm_type_name(type);
        std::map<LinearShape, double> ms_of;
        std::vector<std::array<double, 2>> per_row;  // gflop, oneDNN ms
        for (const auto& j : rows) {
          double gflop = 0.0, onednn_ms = 0.0;
          for (const auto& [shape, count] :
               prompt_linears(ir, j["batch"].get<int>(), o->input_len)) {
            auto it = ms_of.find(shape);
            if (it == ms_of.end()) {
              const std::optional<LibraryGemmTiming> t =
                  model->backend().time_library_gemm(shape[0], shape[1], shape[2], type, 3);
              if (!t) return fmt::format("oneDNN has no {} GEMM for this CPU", name);
              if (type != LibraryGemmType::kF32 && t->impl.find("ref") != std::string::npos)
                return fmt::format("oneDNN has only reference code for {} GEMMs on this CPU", name);
              ctx->log().debug("oneDNN {} x {} -> {} ({}): {:.3f} ms", shape[0], shape[1], shape[2],
                               t->impl, t->ms);
              it = ms_of.emplace(shape, t->ms).first;
            }
            gflop += 2e-9 * count * static_cast<double>(shape[0] * shape[1]) * shape[2];
            onednn_ms += count * it->second;
          }
          per_row.push_back({gflop, onednn_ms});
        }
        for (size_t i = 0; i < rows.size(); ++i) {
          rows[i]["prefill_linear_gflop"] = per_row[i][0];
          rows[i]["onednn_dtype"] = name;
          rows[i]["onednn_linear_ms"] = per_row[i][1];
          rows[i]["prefill_vs_onednn_pct"] =
              100.0 * per_row[i][1] / rows[i]["ttft_ms"].get<double>();
        }
        return {};
      };
      const LibraryGemmType type = ir.precision == Precision::kBf16 ? LibraryGemmType::kBf16
                                   : ir.precision == Precision::kInt8Weight ||
                                           ir.precision == Precision::kInt8 ||
                                           ir.precision == Precision::kInt4Weight
                                       ? LibraryGemmType::kInt8
                                       : LibraryGemmType::kF32;
      std::string why = reference(type);
      if (!why.empty() && type != LibraryGemmType::kF32) {
        const std::string why_f32 = reference(LibraryGemmType::kF32);
        onednn_why = why_f32.empty() ? why : fmt::format("{}; {}", why, why_f32);
        onednn_note = why_f32.empty() ? fmt::format("{}: set against its f32 GEMMs instead", why)
                                      : fmt::format("{}: no comparison", onednn_why);
        why = why_f32;
      } else if (!why.empty()) {
        onednn_why = why;
        onednn_note = fmt::format("{}: no comparison", why);
      }
      if (!why.empty())
        for (auto& j : rows) {
          // Parseable and explicit: no oneDNN figure at all rather than a made-up one.
          j["onednn_dtype"] = nullptr;
          j["onednn_linear_ms"] = nullptr;
          j["prefill_vs_onednn_pct"] = nullptr;
        }
      if (!onednn_note.empty()) {
        ctx->log().warn("vs oneDNN: {}", onednn_note);
        for (auto& j : rows) j["onednn_note"] = onednn_note;
      }
    }
    if (o->json)
      for (const auto& j : rows) kiln::cli::out("{}\n", j.dump());
    if (!o->json) {
      kiln::cli::out(
          "{} ({} {} on {}), prompt {} tokens, {} new tokens, median of {} runs; "
          "load {:.1f} ms (read {:.1f}, weights {:.1f}, compile {:.1f}; backend context {:.1f} "
          "ms apart); read bandwidth {:.1f} GB/s\n",
          o->plan, d.architecture, precision_name(ir.precision), device_name(ir.device),
          o->input_len, o->output_len, o->runs, load_ms, lt.read_ms, lt.weights_ms, lt.compile_ms,
          lt.context_ms, bw.gbps);
      kiln::cli::out("{:>6} {:>10} {:>14} {:>10} {:>14} {:>12} {:>10} {:>10} {:>9} {:>10}\n",
                     "batch", "ttft ms", "ms/token/step", "tokens/s", "prefill tok/s", "MB/step",
                     "roofline", "peak MiB", "w+kv+", "vs oneDNN");
      for (const auto& j : rows)
        kiln::cli::out(
            "{:>6} {:>10.1f} {:>14.2f} {:>10.1f} {:>14.0f} {:>12.1f} {:>9.1f}% {:>10.0f} {:>9} "
            "{:>10}\n",
            j["batch"].get<int>(), j["ttft_ms"].get<double>(),
            j["decode_ms_per_token"].get<double>(), j["tokens_per_s"].get<double>(),
            j["prefill_tokens_per_s"].get<double>(), j["bytes_per_step"].get<double>() / 1e6,
            j["roofline_pct"].get<double>(), j["peak_memory_bytes"].get<double>() / (1 << 20),
            fmt::format("{:.0f}%",
                        j[gpu ? "peak_over_budget_pct" : "peak_over_weights_kv_pct"].get<double>()),
            !j.contains("prefill_vs_onednn_pct") ? std::string("-")
            : j["prefill_vs_onednn_pct"].is_null()
                ? std::string("n/a")
                : fmt::format("{:.0f}%", j["prefill_vs_onednn_pct"].get<double>()));
      if (!gpu && !rows.empty())
        kiln::cli::out("vs oneDNN: {}\n",
                       rows[0]["onednn_dtype"].is_null()
                           ? "n/a: " + onednn_note
                           : fmt::format("oneDNN's {} GEMMs on the prompt step's Linear shapes{}",
                                         rows[0]["onednn_dtype"].get<std::string>(),
                                         onednn_why.empty() ? "" : " (" + onednn_why + ")"));
    }
    return 0;
  };
}

}  // namespace kiln::cli
