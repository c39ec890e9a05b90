// The GEMM throughput oneDNN reaches on this machine, which `kiln bench` sets a CPU plan's prefill
// against on the same shapes in the same run: oneDNN's matmul primitive on the machine's cores
// (its own OpenMP team, run while kiln's pool is idle), the weights reordered once, outside the
// timing, into the layout oneDNN chooses for the shape.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::cpu {

struct OnednnTiming {
  double ms = 0.0;   // median of the timed runs (after one untimed)
  std::string impl;  // oneDNN's implementation for the shape ("brg:avx512_core", ...)
};

// y [rows, out] (f32) = x [rows, in] · w [out, in]ᵀ, with x and w in f32, or both in bf16
// (`bf16`), on `threads` threads, `runs` timed runs. Throws (KILN_CHECK) for a bad shape or
// when oneDNN fails.
OnednnTiming time_onednn_matmul(int64_t rows, int64_t in, int64_t out, bool bf16, int threads,
                                int runs);

}  // namespace kiln::cpu
