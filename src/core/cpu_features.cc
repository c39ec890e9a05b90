#include "core/cpu_features.h"

#include <cpuid.h>
#include <thread>

#include <fmt/format.h>

namespace kiln {

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid_count(1, 0, &a, &b, &c, &d)) f.fma = (c >> 12) & 1;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512_vbmi = (c >> 1) & 1;
    f.avx512_vnni = (c >> 11) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    f.amx_int8 = (d >> 25) & 1;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = (a >> 5) & 1;
  return f;
}

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuIsa best_cpu_isa(const CpuFeatures& f) {
  return f.avx512f && f.avx512bw ? CpuIsa::kAvx512 : CpuIsa::kAvx2;
}

std::string describe_cpu_features() {
  const CpuFeatures f = detect_cpu_features();
  std::string isa = "x86-64";
  if (f.avx2 && f.fma) isa += " AVX2/FMA";
  if (f.avx512f) isa += " AVX-512";
  if (f.avx512_vnni) isa += " VNNI";
  if (f.avx512_bf16) isa += " AVX512-BF16";
  if (f.amx_tile)
    isa += fmt::format(" AMX({}{})", f.amx_bf16 ? "bf16" : "",
                       f.amx_int8 ? (f.amx_bf16 ? ",int8" : "int8") : "");
  return fmt::format("{} ({} hardware threads)", isa, std::thread::hardware_concurrency());
}

}  // namespace kiln
