#include "core/context.h"

#include <cstdlib>
#include <string>
#include <string_view>

namespace kiln {

ContextOptions options_from_environment(ContextOptions base) {
  if (base.threads == 0) {
    if (const char* v = std::getenv("KILN_NUM_THREADS")) {
      const int n = std::atoi(v);
      KILN_CHECK_USAGE(n > 0, "KILN_NUM_THREADS must be a positive integer, got '{}'", v);
      base.threads = n;
    }
  }
  if (!base.cpu_isa) {
    if (const char* v = std::getenv("KILN_CPU_ISA")) {
      const std::string s = v;
      if (s == "avx2")
        base.cpu_isa = CpuIsa::kAvx2;
      else if (s == "avx512")
        base.cpu_isa = CpuIsa::kAvx512;
      else if (s == "auto")
        base.cpu_isa = best_cpu_isa(detect_cpu_features());
      else
        KILN_FAIL_KIND(ErrorKind::kUsage, "KILN_CPU_ISA must be auto|avx2|avx512, got '{}'", s);
    }
  }
  // A two-valued switch in the variable `name` (`a` or `b`; true when it is `on`), unless set
  // explicitly.
  auto switch_from_env = [](const char* name, std::string_view a, std::string_view b,
                            std::string_view on, std::optional<bool>& out) {
    if (out) return;
    if (const char* v = std::getenv(name)) {
      const std::string_view s = v;
      KILN_CHECK_USAGE(s == a || s == b, "{} must be {}|{}, got '{}'", name, a, b, s);
      out = s == on;
    }
  };
  switch_from_env("KILN_CPU_BF16_DOT", "on", "off", "on", base.cpu_bf16_dot);
  switch_from_env("KILN_CPU_INT8_DOT", "on", "off", "on", base.cpu_int8_dot);
  switch_from_env("KILN_CPU_PROFILE", "0", "1", "1", base.cpu_profile);
  if (const char* v = std::getenv("KILN_LOG_LEVEL")) {
    const std::string s = v;
    if (s == "debug")
      base.log_level = LogLevel::kDebug;
    else if (s == "info")
      base.log_level = LogLevel::kInfo;
    else if (s == "warning")
      base.log_level = LogLevel::kWarning;
    else if (s == "error")
      base.log_level = LogLevel::kError;
    else
      KILN_FAIL_KIND(ErrorKind::kUsage, "KILN_LOG_LEVEL must be debug|info|warning|error, got '{}'",
                     s);
  }
  return base;
}

Context::Context(ContextOptions options)
    : options_(options),
      log_(options.log_level),
      pool_(std::make_unique<ThreadPool>(options.threads)) {
  const CpuFeatures features = detect_cpu_features();
  const CpuIsa best = best_cpu_isa(features);
  // The best family the CPU has: at real sizes (bloom-560m fp32, 2 cores) the AVX-512 tiles
  // decode in 179 ms/token against AVX2's 276, and the first token comes in 2.29 s against 2.89.
  cpu_isa_ = options.cpu_isa.value_or(best);
  KILN_CHECK_USAGE(cpu_isa_ != CpuIsa::kAvx512 || best == CpuIsa::kAvx512,
                   "avx512 kernels requested, but this CPU has no AVX-512");
  // On by default where the CPU has it: batched decode and prefill of bf16 plans are
  // compute-bound, and the dot products run at twice the f32 FMA rate.
  KILN_CHECK_USAGE(!options.cpu_bf16_dot.value_or(false) || features.avx512_bf16,
                   "AVX512-BF16 dot products requested, but this CPU has no AVX512-BF16");
  cpu_bf16_dot_ =
      cpu_isa_ == CpuIsa::kAvx512 && options.cpu_bf16_dot.value_or(features.avx512_bf16);
  // Likewise for int8-weight plans (activations quantized to int8 per row in groups; see
  // backend/cpu/kernels_vnni.cc). vpermb (VBMI) reorders the panel16 weights in registers.
  const bool int8_dot = features.avx512_vnni && features.avx512_vbmi;
  KILN_CHECK_USAGE(!options.cpu_int8_dot.value_or(false) || int8_dot,
                   "AVX512-VNNI int8 dot products requested, but this CPU has no AVX512-VNNI and "
                   "AVX512-VBMI");
  cpu_int8_dot_ = cpu_isa_ == CpuIsa::kAvx512 && options.cpu_int8_dot.value_or(int8_dot);
}

}  // namespace kiln
