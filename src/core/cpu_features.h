// The CPU's instruction sets, detected at run time (the binary's baseline is x86-64-v3).
#pragma once

#include <string>

namespace kiln {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;
};

CpuFeatures detect_cpu_features();
std::string describe_cpu_features();

}  // namespace kiln
