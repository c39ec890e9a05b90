// W8A8 Linears on CUDA (int8 plans: x quantized with its static scale, int8 weights, int32 sums)
// and fp8 plans' (E4M3 weights and inputs, f32 sums) against the reference backend, which
// quantizes x by the definition (graph/linear.h) and sums in double: fp16, bf16 and f32 inputs;
// row counts on the GEMV (1, 3, 8: one slice; 13, 32: slices of 8 and a rest, on the
// cuda-block-attention variant, whose GEMV takes up to 32 rows; the others' up to 8) and on
// cuBLASLt's int8 (FP8) GEMM (13 and 32 on the other variants; 33, 65, 300; past one chunk of
// results at 8200 outputs: 1100 rows make two chunks, the second of 78 rows) where cuBLASLt
// takes the shape — `out` a multiple of 16 (1024)
// for certain; where it has no algorithm those rows run on the GEMV, which they then check. `in` a
// multiple of 8 but not 16 (1032; fp8 1040), of several GEMV passes (4104), short (64); `out` not
// a multiple of the GEMV's four features. Scales that clip the inputs (1.5 / 127 with x in [-2,
// 2)) and a scale of 0. Variants: bias with an activation, an f32 bias, a fused residual, a
// widened f32 output and gathered rows. Skipped where no backend runs them (no GPU).
#include <gtest/gtest.h>

#include "backend_ops.h"
#include "quant_linear_cases.h"

namespace kiln::test {
namespace {

// x in [-2, 2): values past 1.5 clip.
constexpr float kClippingScale = 1.5f / 127.0f;
constexpr Variant kW8a8Variants[] = {Variant::kPlain,   Variant::kBiasAct,
                                     Variant::kF32Bias, Variant::kResidual,
                                     Variant::kWidened, Variant::kGatheredWidened};

// The cases of both tests; fp8 needs `in` a multiple of 16 (1032 becomes 1040).
int compare_quantized_input_cases(bool fp8) {
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32})
    for (const LinearShape sh :
         {LinearShape{64, 37}, LinearShape{512, 1024}, LinearShape{fp8 ? 1040 : 1032, 70},
          LinearShape{fp8 ? 4112 : 4104, 21}, LinearShape{256, 8200}})
      for (int64_t n : {1, 3, 8, 13, 32, 33, 65, 300, 1100})
        for (Variant variant : kW8a8Variants) {
          if (dtype == DType::kF32 && widens(variant)) continue;
          // Every variant at 1, 13 and 65 rows (the GEMV's one row and slices, the GEMM), the
          // plain Linear elsewhere; 1100 rows only where they make two chunks (8200 outputs).
          if (variant != Variant::kPlain && n != 1 && n != 13 && n != 65) continue;
          if (n == 1100 && sh.out != 8200) continue;
          if (sh.out == 8200 && (variant != Variant::kPlain || (n != 1 && n != 65 && n != 1100)))
            continue;
          const auto seed =
              static_cast<uint32_t>(sh.in + 3 * sh.out + n + 11 * static_cast<int>(variant));
          Gen g(dtype, dtype, seed);
          // E4M3 saturates at 448: a scale of 1.5 / 448 clips x past 1.5 as int8's does.
          const Graph graph =
              int8_linear_graph(g, dtype, sh.in, sh.out, variant, true, false,
                                fp8 ? kClippingScale * 127.0f / 448.0f : kClippingScale, fp8);
          // int8: the integer sums are exact on both sides, the dequantization rounds in f32 (the
          // reference in double) before the output is rounded to its type; a widened output was
          // rounded to fp16/bf16 first (the reference's Linear, then its cast), so it may differ
          // by one ulp of that type. fp8: each product is exact; the GEMV's f32 sums round (a few
          // ulps of the largest output at these lengths); cuBLASLt's FP8 GEMM (from 9 rows) sums
          // on the tensor cores, whose FP8 MMA keeps about 13 bits of the running sum (measured
          // on the H100, 2026-12-08: 60 % of the elements off by more than 1e-5 of the largest
          // output, 0.15-0.2 % by more than 1e-4, at in = 256 and 512; a wrong scale or index
          // is off by far more than 1e-3).
          double tol = 0.0;
          if (widens(variant)) tol = dtype_tolerance(dtype);
          // (8: the GEMV's default rows, KILN_CUDA_W8A8_GEMV_ROWS.)
          if (fp8 && dtype == DType::kF32) tol = n > 8 ? 1e-3 : 1e-5;
          const Check check{CheckKind::kMaxRelative, tol};
          compared += compare_on_cuda(
              *reference, backends, g, graph, n, sh.in, sh.out, variant, check,
              std::string(fp8 ? "fp8 " : "w8a8 ") + case_name(dtype, variant, n, sh.in, sh.out));
        }
  return compared;
}

TEST(BackendOps, CudaW8a8LinearsMatchReference) {
  if (compare_quantized_input_cases(false) == 0)
    GTEST_SKIP() << "no backend here runs W8A8 Linears on CUDA";
}

TEST(BackendOps, CudaFp8LinearsMatchReference) {
  if (compare_quantized_input_cases(true) == 0)
    GTEST_SKIP() << "no backend here runs fp8 Linears on CUDA";
}

// A scale of 0 (an input that was always 0 in calibration): every level is 0 and y is the bias,
// on the GEMV and the GEMM.
TEST(BackendOps, CudaW8a8ZeroScaleGivesTheBias) {
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  int compared = 0;
  for (int64_t n : {1, 65}) {
    Gen g(DType::kF16, DType::kF16, 77 + static_cast<uint32_t>(n));
    const Graph graph =
        int8_linear_graph(g, DType::kF16, 128, 40, Variant::kF32Bias, true, false, 0.0f);
    compared += compare_on_cuda(*reference, backends, g, graph, n, 128, 40, Variant::kF32Bias,
                                Check{CheckKind::kExact, 0.0}, "zero scale, " + std::to_string(n));
  }
  if (compared == 0) GTEST_SKIP() << "no backend here runs W8A8 Linears on CUDA";
}

}  // namespace
}  // namespace kiln::test
