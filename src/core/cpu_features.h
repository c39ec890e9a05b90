// The CPU's instruction sets, detected at run time (the binary's baseline is x86-64-v3).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool avx512_vbmi = false;  // vpermb, which the int8 dot products reorder weights with
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;
};

CpuFeatures detect_cpu_features();

// Kernel families the CPU backend can run. kAvx2 is the build's baseline (x86-64-v3).
enum class CpuIsa : uint8_t { kAvx2, kAvx512 };
std::string_view cpu_isa_name(CpuIsa isa);
// The widest family this CPU runs.
CpuIsa best_cpu_isa(const CpuFeatures& features);
std::string describe_cpu_features();

}  // namespace kiln
