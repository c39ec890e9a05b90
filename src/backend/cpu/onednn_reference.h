// The GEMM throughput oneDNN reaches on this machine, which `kiln bench` sets a CPU plan's prefill
// against on the same shapes in the same run: oneDNN's matmul primitive on the machine's cores
// (its own OpenMP team, run while kiln's pool is idle), the weights reordered once, outside the
// timing, into the layout oneDNN chooses for the shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln::cpu {

struct OnednnTiming {
  double ms = 0.0;   // median of the timed runs (after one untimed)
  std::string impl;  // oneDNN's implementation for the shape ("brg:avx512_core", ...)
};

// The operands' types: f32 × f32, bf16 × bf16, or u8 activations × s8 weights (int8, as an
// int8-weight plan's dot products quantize their inputs), f32 results in every case.
enum class OnednnType { kF32, kBf16, kInt8 };
const char* onednn_type_name(OnednnType t);

// y [rows, out] (f32) = x [rows, in] · w [out, in]ᵀ in `type`, on `threads` threads, `runs` timed
// runs. Nothing when oneDNN has no implementation of that GEMM for this CPU (or for the ISA
// ONEDNN_MAX_CPU_ISA allows it: a bf16 matmul on a CPU without AVX-512, for one), which is a fact
// of the machine, not an error. Throws (KILN_CHECK) for a bad shape or when oneDNN fails otherwise.
std::optional<OnednnTiming> time_onednn_matmul(int64_t rows, int64_t in, int64_t out,
                                               OnednnType type, int threads, int runs);

}  // namespace kiln::cpu
