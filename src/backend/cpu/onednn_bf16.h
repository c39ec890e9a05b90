// bf16 × bf16 → f32 GEMMs through oneDNN's matmul primitive, for the prefill of bf16 plans: on
// CPUs with AVX512-BF16 (or AMX) oneDNN multiplies bf16 pairs in hardware and accumulates in f32,
// about twice the fp32 rate. Each call is single-threaded (the caller runs one per pool thread,
// as the fp32 path does with sgemm), so no OpenMP team runs beside kiln's pool.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::cpu {

// The oneDNN implementation a bf16 matmul gets on this CPU ("brg:avx512_core_bf16", ...), or ""
// when oneDNN has only its reference code for it (no bf16 instructions): then the caller keeps
// its own kernels. Decided once per process (it depends on the CPU alone).
const std::string& onednn_bf16_matmul_impl();

// y [m, ldy] (f32, columns [0, n)) = a [m, k] (bf16, row-major) · w [n, k]ᵀ (bf16, row-major).
// Throws (KILN_CHECK) when oneDNN fails.
void onednn_matmul_bf16(const uint16_t* a, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                        float* y, int64_t ldy);

}  // namespace kiln::cpu
