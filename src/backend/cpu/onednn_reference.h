// The GEMM throughput oneDNN reaches on this machine, which `kiln bench` sets a CPU plan's prefill
// against on the same shapes in the same run: oneDNN's matmul primitive on the machine's cores
// (its own OpenMP team, run while kiln's pool is idle), the weights reordered once, outside the
// timing, into the layout oneDNN chooses for the shape.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/library_gemm.h"

namespace kiln::cpu {

// y [rows, out] (f32) = x [rows, in] · w [out, in]ᵀ in `type`, on `threads` threads, `runs` timed
// runs. Nothing when oneDNN has no implementation of that GEMM for this CPU (or for the ISA
// ONEDNN_MAX_CPU_ISA allows it: a bf16 matmul on a CPU without AVX-512, for one), which is a fact
// of the machine, not an error. Throws (KILN_CHECK) for a bad shape or when oneDNN fails otherwise.
std::optional<LibraryGemmTiming> time_onednn_matmul(int64_t rows, int64_t in, int64_t out,
                                                    LibraryGemmType type, int threads, int runs);

}  // namespace kiln::cpu
