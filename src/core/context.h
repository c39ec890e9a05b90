// What a kiln session owns: logging, the CPU thread pool, and options read once from the
// environment. Everything that would otherwise be a global lives here.
#pragma once

#include <memory>
#include <optional>

#include "core/cpu_features.h"

#include "core/logging.h"
#include "core/thread_pool.h"

namespace kiln {

struct ContextOptions {
  LogLevel log_level = LogLevel::kWarning;
  int threads = 0;  // 0: KILN_NUM_THREADS if set, else one per hardware thread
  // CPU kernel family; unset: KILN_CPU_ISA (avx2|avx512|auto = the widest the CPU runs) if set,
  // else avx2.
  std::optional<CpuIsa> cpu_isa;
  // With avx512 kernels, bf16 weights in AVX512-BF16 dot products (activations rounded to bf16
  // per row) instead of f32 FMAs; unset: KILN_CPU_BF16_DOT (on|off) if set, else on where the
  // CPU has AVX512-BF16.
  std::optional<bool> cpu_bf16_dot;
  // With avx512 kernels, i8 weights in AVX512-VNNI dot products (activations quantized to int8
  // per row in groups of 128) instead of f32 FMAs; unset: KILN_CPU_INT8_DOT (on|off) if set, else
  // on where the CPU has AVX512-VNNI and AVX512-VBMI.
  std::optional<bool> cpu_int8_dot;
  // Time every node of the CPU executors and log, per graph, each kernel class's time per step
  // (at INFO, when the executor goes away); unset: KILN_CPU_PROFILE=1.
  std::optional<bool> cpu_profile;
};

// Reads KILN_NUM_THREADS, KILN_LOG_LEVEL, KILN_CPU_ISA, KILN_CPU_BF16_DOT, KILN_CPU_INT8_DOT
// and KILN_CPU_PROFILE once; explicit options win.
ContextOptions options_from_environment(ContextOptions base = {});

class Context {
 public:
  explicit Context(ContextOptions options = {});
  Logger& log() { return log_; }
  const Logger& log() const { return log_; }
  ThreadPool& pool() { return *pool_; }
  CpuIsa cpu_isa() const { return cpu_isa_; }
  // The avx512 family's bf16 Linears use AVX512-BF16 dot products.
  bool cpu_bf16_dot() const { return cpu_bf16_dot_; }
  // The avx512 family's i8-weight Linears use AVX512-VNNI dot products.
  bool cpu_int8_dot() const { return cpu_int8_dot_; }
  const ContextOptions& options() const { return options_; }

 private:
  ContextOptions options_;
  Logger log_;
  std::unique_ptr<ThreadPool> pool_;
  CpuIsa cpu_isa_ = CpuIsa::kAvx2;
  bool cpu_bf16_dot_ = false;
  bool cpu_int8_dot_ = false;
};

}  // namespace kiln
