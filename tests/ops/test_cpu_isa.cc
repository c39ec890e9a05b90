// Both CPU kernel families (the x86-64-v3 baseline and AVX-512, chosen at run time) compute the
// fixture models' logits within the parity tolerance of HuggingFace.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../models/model_runner.h"
#include "../models/parity_util.h"
#include "backend/cpu/vector_math.h"
#include "backend/reference/reference_backend.h"
#include "builder/builder.h"

namespace kiln::test {
namespace {

TEST(CpuIsa, EveryKernelFamilyMatchesHuggingFace) {
  const bool has_avx512 = best_cpu_isa(detect_cpu_features()) == CpuIsa::kAvx512;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa == CpuIsa::kAvx512 && !has_avx512) {
      GTEST_SKIP() << "this CPU has no AVX-512; the avx2 family was checked";
    }
    ContextOptions o{LogLevel::kError, 2};
    o.cpu_isa = isa;
    Context ctx(o);
    const std::string described = make_cpu_backend(ctx)->describe();
    EXPECT_NE(described.find(cpu_isa_name(isa)), std::string::npos) << described;
    for (const char* model : {"t5-tiny", "bloom-tiny"}) {
      auto engine = compile_model_dir(ctx, fixture(model));
      const SafetensorsFile ref =
          SafetensorsFile::open(fixture(std::string(model) + "/reference.safetensors"));
      for (int c : {0, 8}) {
        const std::string k = "case" + std::to_string(c);
        std::vector<int64_t> seq = ids_of(ref.tensors().at(k + ".greedy_ids"));
        seq.pop_back();
        const Forward f =
            run_forward(*engine, ids_of(ref.tensors().at(k + ".input_ids")), seq, false);
        EXPECT_LE(relative_error(f.logits, ref.tensors().at(k + ".logits")), 1e-4)
            << model << " " << k << " " << cpu_isa_name(isa);
      }
    }
  }
}

// KILN_CPU_BF16_DOT takes on|off; the dot products belong to the avx512 family (an avx2 context
// never uses them) and are refused on a CPU without AVX512-BF16.
TEST(CpuIsa, Bf16DotProductsFollowTheirOption) {
  setenv("KILN_CPU_BF16_DOT", "maybe", 1);
  EXPECT_THROW(options_from_environment({}), Error);
  setenv("KILN_CPU_BF16_DOT", "off", 1);
  EXPECT_EQ(options_from_environment({}).cpu_bf16_dot, std::optional<bool>(false));
  unsetenv("KILN_CPU_BF16_DOT");
  ContextOptions o{LogLevel::kError, 1};
  o.cpu_bf16_dot = true;
  if (!detect_cpu_features().avx512_bf16) {
    EXPECT_THROW(Context{o}, Error);
    return;
  }
  o.cpu_isa = CpuIsa::kAvx2;
  EXPECT_FALSE(Context(o).cpu_bf16_dot());
  if (best_cpu_isa(detect_cpu_features()) != CpuIsa::kAvx512) return;
  o.cpu_isa = CpuIsa::kAvx512;
  Context ctx(o);
  EXPECT_TRUE(ctx.cpu_bf16_dot());
  EXPECT_NE(make_cpu_backend(ctx)->describe().find("avx512-bf16"), std::string::npos);
}

// KILN_CPU_INT8_DOT likewise: on|off, avx512 family only, refused without AVX512-VNNI and VBMI,
// and on by default where the CPU has them.
TEST(CpuIsa, Int8DotProductsFollowTheirOption) {
  setenv("KILN_CPU_INT8_DOT", "off", 1);
  EXPECT_EQ(options_from_environment({}).cpu_int8_dot, std::optional<bool>(false));
  setenv("KILN_CPU_INT8_DOT", "on", 1);
  EXPECT_EQ(options_from_environment({}).cpu_int8_dot, std::optional<bool>(true));
  unsetenv("KILN_CPU_INT8_DOT");
  const CpuFeatures f = detect_cpu_features();
  const bool has = f.avx512_vnni && f.avx512_vbmi && best_cpu_isa(f) == CpuIsa::kAvx512;
  ContextOptions o{LogLevel::kError, 1};
  EXPECT_EQ(Context(o).cpu_int8_dot(), has);
  o.cpu_int8_dot = true;
  if (!(f.avx512_vnni && f.avx512_vbmi)) {
    EXPECT_THROW(Context{o}, Error);
    return;
  }
  o.cpu_isa = CpuIsa::kAvx2;
  EXPECT_FALSE(Context(o).cpu_int8_dot());
  if (!has) return;
  o.cpu_isa = CpuIsa::kAvx512;
  Context ctx(o);
  EXPECT_TRUE(ctx.cpu_int8_dot());
  EXPECT_NE(make_cpu_backend(ctx)->describe().find("avx512-vnni"), std::string::npos);
  o.cpu_int8_dot = false;
  Context off(o);
  EXPECT_EQ(make_cpu_backend(off)->describe().find("avx512-vnni"), std::string::npos);
}

TEST(CpuIsa, BadInputInt8DotSwitchInEnvironment) {
  for (const char* bad : {"maybe", "", "ON", "1"}) {
    setenv("KILN_CPU_INT8_DOT", bad, 1);
    EXPECT_THROW(options_from_environment({}), Error) << "'" << bad << "'";
  }
  unsetenv("KILN_CPU_INT8_DOT");
}

TEST(CpuIsa, BadInputUnknownFamilyInEnvironment) {
  setenv("KILN_CPU_ISA", "sse9", 1);
  EXPECT_THROW(options_from_environment({}), Error);
  unsetenv("KILN_CPU_ISA");
}

// The AVX-512 family's activations (sixteen lanes: the Linear epilogues over packed weights, and
// the gated activation node) are bit for bit the baseline's eight-lane ones, over the ranges where
// exp saturates, the special values, and rows whose tails are shorter than a vector.
// `kiln bench`'s yardstick comes from the backend: the CPU backend times oneDNN's f32 matmul (an
// implementation every x86-64 oneDNN has), a backend with no library answers nothing, and a bad
// shape is an error naming it.
TEST(CpuIsa, TheCpuBackendTimesOnednnGemms) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto cpu = make_cpu_backend(ctx);
  const std::optional<LibraryGemmTiming> t =
      cpu->time_library_gemm(8, 64, 32, LibraryGemmType::kF32, 2);
  ASSERT_TRUE(t.has_value()) << "oneDNN has an f32 matmul on any x86-64 CPU";
  EXPECT_GT(t->ms, 0.0);
  EXPECT_FALSE(t->impl.empty());
  EXPECT_STREQ(library_gemm_type_name(LibraryGemmType::kInt8), "u8s8");
  try {
    cpu->time_library_gemm(0, 64, 32, LibraryGemmType::kF32, 2);
    ADD_FAILURE() << "a GEMM of 0 rows was timed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows 0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(make_reference_backend(ctx)->time_library_gemm(8, 64, 32, LibraryGemmType::kF32, 2))
      << "the reference backend has no library to compare with";
}

TEST(CpuIsa, SixteenLaneActivationsEqualEightLaneBitForBit) {
  if (best_cpu_isa(detect_cpu_features()) != CpuIsa::kAvx512)
    GTEST_SKIP() << "this CPU has no AVX-512: only the eight-lane activations run";
  std::vector<float> x;
  for (float v = -120.0f; v <= 120.0f; v += 0.0137f) x.push_back(v);
  for (float v = -1e-3f; v <= 1e-3f; v += 3.1e-6f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v :
       {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 87.3365f, -87.3365f,
        88.7228f, -88.7228f, 61.95f, -61.95f, 44.4f, -44.4f})
    x.push_back(v);
  for (Activation act :
       {Activation::kRelu, Activation::kGeluTanh, Activation::kGeluExact, Activation::kSilu}) {
    for (size_t n :
         {size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, x.size()}) {
      for (size_t start = 0; start + n <= x.size(); start += std::max<size_t>(n, 997)) {
        std::vector<float> eight(n), sixteen(n, 12345.0f), gated8(n), gated16(n, 12345.0f);
        const float* gx = x.data() + start;
        const float* up = x.data() + (start + 13) % (x.size() - n + 1);  // another slice
        const auto count = static_cast<int64_t>(n);
        cpu::apply_activation(act, gx, eight.data(), count);
        cpu::apply_activation_avx512(act, gx, sixteen.data(), count);
        cpu::apply_gated_activation(act, gx, up, gated8.data(), count);
        cpu::apply_gated_activation_avx512(act, gx, up, gated16.data(), count);
        for (size_t i = 0; i < n; ++i) {
          uint32_t a = 0, b = 0, c = 0, d = 0;
          std::memcpy(&a, &eight[i], 4);
          std::memcpy(&b, &sixteen[i], 4);
          std::memcpy(&c, &gated8[i], 4);
          std::memcpy(&d, &gated16[i], 4);
          ASSERT_EQ(a, b) << "activation " << static_cast<int>(act) << " of " << gx[i] << ": "
                          << eight[i] << " against " << sixteen[i] << " (n " << n << ")";
          ASSERT_EQ(c, d) << "gated activation " << static_cast<int>(act) << " of " << gx[i]
                          << " times " << up[i] << ": " << gated8[i] << " against " << gated16[i]
                          << " (n " << n << ")";
        }
      }
    }
  }
  // In place, as the epilogues call it.
  std::vector<float> y(x.begin(), x.begin() + 100), z = y;
  cpu::apply_activation(Activation::kGeluTanh, y.data(), y.data(), 100);
  cpu::apply_activation_avx512(Activation::kGeluTanh, z.data(), z.data(), 100);
  EXPECT_EQ(0, std::memcmp(y.data(), z.data(), 100 * sizeof(float)));
}

}  // namespace
}  // namespace kiln::test
