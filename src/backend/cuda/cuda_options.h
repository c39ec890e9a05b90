// Every switch of the CUDA backend in one struct with its defaults (the fastest measured), filled
// from the KILN_CUDA_* environment variables in one place (from_environment), and described for
// `kiln bench -v` and `kiln inspect --device`. Most exist to time a change against the path
// before it (docs/backends.md); the context reads them from here, never from the environment.
#pragma once

#include <vector>

#include "backend/backend_option.h"
#include "backend/cuda/kernels.cuh"

namespace kiln::cuda {

struct CudaOptions {
  // KILN_CUDA_GRAPHS=0: decode steps are launched kernel by kernel instead of replayed from a
  // captured CUDA graph.
  bool graphs = true;
  // KILN_CUDA_GRAPH_TOKENS=N: steps of at most N tokens are replayed from CUDA graphs (decode
  // steps, and the steps prompts join while the batch decodes: up to the batch plus the
  // scheduler's join_prompt_tokens); longer ones launch kernel by kernel.
  int graph_tokens = 256;
  // KILN_CUDA_GEMV=0: few-row Linears run on cuBLASLt instead of kiln's GEMV (the skinny GEMM's
  // rows are still skinny_rows').
  bool gemv = true;
  // KILN_CUDA_GEMV_NORM=0: a Linear's fused input norm runs as the norm kernel into scratch
  // memory before the GEMV instead of inside it.
  bool gemv_norm = true;
  // KILN_CUDA_SPLIT=0: decode attention never splits along the keys.
  bool splits = true;
  // KILN_CUDA_WARP_ATTN=0: steps that do not take the tiled kernel run attention.cu's row
  // kernel instead of the warp kernel (attention_warps.cu) wherever that fits.
  bool warp_attention = true;
  // KILN_CUDA_PDL=0: kernels wait for the one before them to finish before they start, instead
  // of programmatic dependent launch (which needs sm_90 or newer either way).
  bool programmatic_launch = true;
  // KILN_CUDA_DEFER_CHECK=0: every step waits for the GPU in execute().
  bool defer_checks = true;
  // KILN_CUDA_TILED=0|always: which steps' attention runs on the tensor-core kernel
  // (attention_tiled.cu): prompts large enough to fill the GPU (default), none, or every step it
  // can run (tests of the kernel on small cases).
  TiledAttention tiled_attention = TiledAttention::kAuto;
  // KILN_CUDA_TILED_ROWS=32|64: query rows per block of that kernel.
  int tiled_rows = 64;
  // KILN_CUDA_GEMV_WIDE=0|1|2: which one-row GEMVs take the wide instance (GemvParams::wide):
  // none, those of a Linear run right after another Linear (cuda_linear.cc), all.
  int gemv_wide = 1;
  // KILN_CUDA_GEMV_WARPS=N: the warps per SM a GEMV's split aims at, at every row count; 0: 16
  // at one row, 8 at more (CudaContext::gemv_warps_per_sm).
  int gemv_warps = 0;
  // KILN_CUDA_GEMV_NORM_WARPS=N: the same for the one-row GEMV with a folded norm; 0: as above.
  int gemv_norm_warps = 0;
  // KILN_CUDA_GEMV_ROWS=1..kGemvMaxRows: the most rows a Linear without a tactic runs on the
  // GEMV (at build time also the default the tactic timing compares against).
  int gemv_rows = kGemvDefaultRows;
  // KILN_CUDA_SKINNY_ROWS=0..kSkinnyMaxRows: the most rows a Linear without a tactic runs on the
  // tensor-core skinny GEMM; 0: never, whatever the plan's tactics chose (cuBLASLt from
  // gemv_rows + 1), and tactic timing skips it.
  int skinny_rows = kSkinnyDefaultRows;
  // KILN_CUDA_GEMM_ROW_BUCKET=N: a cuBLASLt Linear of a row count above N it has not run yet
  // takes the algorithm its heuristic chose for the next multiple of N (checked for the actual
  // count with cublasLtMatmulAlgoCheck) instead of a heuristic query of its own, which costs the
  // host ~0.1-0.3 ms per Linear while the GPU waits (served prompt steps have a new row count
  // almost every time); 0: a heuristic query per row count.
  int gemm_row_bucket = 64;
  // KILN_CUDA_I8_GEMV_ROWS=0..kI8GemvMaxRows: the most rows an int8-weight Linear runs on the
  // int8 GEMV (cuda_linear_i8.cc; its 8-row slices at 16 rows took 3.5 ms a bloom-560m step on an
  // H100, widened weights on cuBLASLt 1.6); more rows run the skinny GEMM or widen the weights.
  int i8_gemv_rows = kI8GemvDefaultRows;
  // KILN_CUDA_W8A8_GEMV_ROWS=0..kW8a8GemvMaxRows: the most rows a W8A8 or fp8 Linear runs on its
  // GEMV (cuda_linear_w8a8.cc); more rows run cuBLASLt's int8 / FP8 GEMM. On an H100 bloom-560m's
  // batch-16 step took 2.16 (W8A8) and 3.74 ms (fp8) on the GEMV's 8-row slices, where batch 64 on
  // the GEMM took 2.08 and 1.96 (2026-12-08), as int8-weight's slices were slower than its GEMMs.
  int w8a8_gemv_rows = kW8a8GemvDefaultRows;
  // KILN_CUDA_ATTN_WARPS=16|8|4: the batch-1 decode attention's block size; 0: the fewest of 8
  // and 16 that cover the keys in one pass.
  int attention_warps = 0;
  // KILN_CUDA_TACTICS_INEXACT=1: a Linear runs the tactic of the smallest tuned row count >= its
  // rows at every count (LinearKernel::tactic_for).
  bool inexact_tactics = false;
  // KILN_CUDA_UPLOAD_THREADS=N: the threads that upload a plan's weights (0: each weight alone,
  // when first used); default half the cores, 1 to 8.
  int upload_threads = 1;
  // KILN_CUDA_UPLOAD_CHUNK_MB=N: the MiB an upload thread stages at a time.
  int upload_chunk_mib = 4;
  // KILN_CUDA_PROFILE=1: executors time every node with CUDA events (steps run eagerly) and log
  // each kernel class's GPU and host time when they go away; =steps: whole steps only (graphs
  // stay on), each step size's GPU time beside its wall time.
  enum class Profile : int { kOff, kKernels, kSteps };
  Profile profile = Profile::kOff;

  // The defaults, with the variables that are set applied; throws a usage error naming a
  // variable whose value is out of range.
  static CudaOptions from_environment();
  // Each option with its variable and value, in declaration order.
  std::vector<BackendOption> describe() const;
};

}  // namespace kiln::cuda
