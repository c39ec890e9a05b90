#include "backend/cuda/cuda_options.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

#include "backend/cuda_info.h"
#include "core/status.h"

namespace kiln::cuda {
namespace {

const char* env(const char* name) { return std::getenv(name); }

// A switch that only "0" turns off.
void on_unless_zero(const char* name, bool* out) {
  const char* v = env(name);
  if (v != nullptr && std::string_view(v) == "0") *out = false;
}

// A whole number: digits only, in [lo, hi]; else a usage error naming it.
void number(const char* name, int lo, int hi, const char* what, int* out) {
  const char* v = env(name);
  if (v == nullptr) return;
  const std::string_view s(v);
  const bool digits = !s.empty() && s.size() <= 9 &&
                      std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  const long parsed = digits ? std::strtol(v, nullptr, 10) : -1;
  KILN_CHECK_USAGE(digits && parsed >= lo && parsed <= hi, "{}={}: give {}, {} to {}", name, v,
                   what, lo, hi);
  *out = static_cast<int>(parsed);
}

std::string on_off(bool on) { return on ? "1" : "0"; }

std::string_view tiled_name(TiledAttention t) {
  switch (t) {
    case TiledAttention::kOff:
      return "0";
    case TiledAttention::kAuto:
      return "auto";
    case TiledAttention::kAlways:
      return "always";
  }
  return "?";
}

std::string_view profile_name(CudaOptions::Profile p) {
  switch (p) {
    case CudaOptions::Profile::kOff:
      return "0";
    case CudaOptions::Profile::kKernels:
      return "1";
    case CudaOptions::Profile::kSteps:
      return "steps";
  }
  return "?";
}

}  // namespace

CudaOptions CudaOptions::from_environment() {
  CudaOptions o;
  on_unless_zero("KILN_CUDA_GRAPHS", &o.graphs);
  number("KILN_CUDA_GRAPH_TOKENS", 1, 4096, "the most tokens of a step replayed from a CUDA graph",
         &o.graph_tokens);
  on_unless_zero("KILN_CUDA_GEMV", &o.gemv);
  on_unless_zero("KILN_CUDA_GEMV_NORM", &o.gemv_norm);
  on_unless_zero("KILN_CUDA_SPLIT", &o.splits);
  on_unless_zero("KILN_CUDA_WARP_ATTN", &o.warp_attention);
  on_unless_zero("KILN_CUDA_PDL", &o.programmatic_launch);
  on_unless_zero("KILN_CUDA_DEFER_CHECK", &o.defer_checks);
  if (const char* v = env("KILN_CUDA_TILED"))
    o.tiled_attention = std::string_view(v) == "0"        ? TiledAttention::kOff
                        : std::string_view(v) == "always" ? TiledAttention::kAlways
                                                          : TiledAttention::kAuto;
  if (const char* v = env("KILN_CUDA_TILED_ROWS"))
    o.tiled_rows = std::string_view(v) == "32" ? 32 : 64;
  number("KILN_CUDA_GEMV_WARPS", 1, 64, "the warps per SM", &o.gemv_warps);
  number("KILN_CUDA_GEMV_NORM_WARPS", 1, 64, "the warps per SM", &o.gemv_norm_warps);
  number("KILN_CUDA_GEMV_WIDE", 0, 2, "0 (off), 1 (after another Linear) or 2 (every one-row GEMV)",
         &o.gemv_wide);
  number("KILN_CUDA_GEMV_ROWS", 1, kGemvMaxRows, "the most rows an untuned Linear runs on the GEMV",
         &o.gemv_rows);
  number("KILN_CUDA_SKINNY_ROWS", 0, kSkinnyMaxRows,
         "the most rows an untuned Linear runs on the skinny GEMM (0: none)", &o.skinny_rows);
  number("KILN_CUDA_GEMM_ROW_BUCKET", 0, 4096,
         "the row counts whose cuBLASLt algorithm is chosen once per multiple (0: per row count)",
         &o.gemm_row_bucket);
  number("KILN_CUDA_I8_GEMV_ROWS", 0, kI8GemvMaxRows,
         "the most rows an int8-weight Linear runs on the int8 GEMV", &o.i8_gemv_rows);
  number("KILN_CUDA_W8A8_GEMV_ROWS", 0, kW8a8GemvMaxRows,
         "the most rows a W8A8 or fp8 Linear runs on its GEMV", &o.w8a8_gemv_rows);
  if (const char* v = env("KILN_CUDA_ATTN_WARPS")) {
    const std::string_view s(v);
    KILN_CHECK_USAGE(s == "0" || s == "4" || s == "8" || s == "16",
                     "KILN_CUDA_ATTN_WARPS={}: give 16, 8 or 4 (0: by the key count)", v);
    o.attention_warps = std::atoi(v);
  }
  if (const char* v = env("KILN_CUDA_TACTICS_INEXACT")) {
    KILN_CHECK_USAGE(std::string_view(v) == "0" || std::string_view(v) == "1",
                     "KILN_CUDA_TACTICS_INEXACT={}: give 1 or 0", v);
    o.inexact_tactics = std::string_view(v) == "1";
  }
  o.upload_threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8);
  number("KILN_CUDA_UPLOAD_THREADS", 0, 32,
         "the threads that upload a plan's weights (0: each weight alone, when first used)",
         &o.upload_threads);
  number("KILN_CUDA_UPLOAD_CHUNK_MB", 1, 64, "the MiB a weight upload thread stages at a time",
         &o.upload_chunk_mib);
  if (const char* v = env("KILN_CUDA_PROFILE"))
    o.profile = std::string_view(v) == "steps" ? Profile::kSteps : Profile::kKernels;
  return o;
}

std::vector<BackendOption> CudaOptions::describe() const {
  auto warps = [](int n) { return n == 0 ? std::string("auto") : std::to_string(n); };
  return {
      {"KILN_CUDA_GRAPHS", on_off(graphs), "decode steps replayed from CUDA graphs"},
      {"KILN_CUDA_GRAPH_TOKENS", std::to_string(graph_tokens),
       "most tokens of a step replayed from a graph"},
      {"KILN_CUDA_GEMV", on_off(gemv), "few-row Linears on kiln's GEMV"},
      {"KILN_CUDA_GEMV_NORM", on_off(gemv_norm), "a Linear's input norm folded into the GEMV"},
      {"KILN_CUDA_SPLIT", on_off(splits), "decode attention split along the keys"},
      {"KILN_CUDA_WARP_ATTN", on_off(warp_attention), "the warp decode attention"},
      {"KILN_CUDA_PDL", on_off(programmatic_launch), "programmatic dependent launch (sm_90+)"},
      {"KILN_CUDA_DEFER_CHECK", on_off(defer_checks), "decode steps return before the GPU is done"},
      {"KILN_CUDA_TILED", std::string(tiled_name(tiled_attention)),
       "prompt attention on the tensor-core tiled kernel"},
      {"KILN_CUDA_TILED_ROWS", std::to_string(tiled_rows), "query rows per tiled block"},
      {"KILN_CUDA_GEMV_WIDE", std::to_string(gemv_wide),
       "wide one-row GEMV: 0 off, 1 after a Linear, 2 all"},
      {"KILN_CUDA_GEMV_WARPS", warps(gemv_warps), "warps per SM a GEMV aims at"},
      {"KILN_CUDA_GEMV_NORM_WARPS", warps(gemv_norm_warps),
       "warps per SM a one-row GEMV with a folded norm aims at"},
      {"KILN_CUDA_GEMV_ROWS", std::to_string(gemv_rows),
       "most rows an untuned Linear runs on the GEMV"},
      {"KILN_CUDA_GEMM_ROW_BUCKET", std::to_string(gemm_row_bucket),
       "cuBLASLt algorithms chosen once per multiple of this many rows (0: per row count)"},
      {"KILN_CUDA_SKINNY_ROWS", std::to_string(skinny_rows),
       "most rows an untuned Linear runs on the skinny GEMM"},
      {"KILN_CUDA_I8_GEMV_ROWS", std::to_string(i8_gemv_rows),
       "most rows an int8-weight Linear runs on the int8 GEMV"},
      {"KILN_CUDA_W8A8_GEMV_ROWS", std::to_string(w8a8_gemv_rows),
       "most rows a W8A8 or fp8 Linear runs on its GEMV"},
      {"KILN_CUDA_ATTN_WARPS", warps(attention_warps), "warps of a batch-1 decode attention block"},
      {"KILN_CUDA_TACTICS_INEXACT", on_off(inexact_tactics),
       "steps run the next larger timed row count's tactic"},
      {"KILN_CUDA_UPLOAD_THREADS", std::to_string(upload_threads), "threads uploading the weights"},
      {"KILN_CUDA_UPLOAD_CHUNK_MB", std::to_string(upload_chunk_mib),
       "MiB an upload thread stages"},
      {"KILN_CUDA_PROFILE", std::string(profile_name(profile)),
       "time every kernel (1) or every step (steps)"},
  };
}

}  // namespace kiln::cuda

namespace kiln {

std::vector<BackendOption> cuda_options() {
  return cuda::CudaOptions::from_environment().describe();
}

}  // namespace kiln
