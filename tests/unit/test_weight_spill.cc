// The build's weight spill (io/weight_spill.h): spilled tensors read back the bytes that were
// put, the pieces of a streamed hash give the one-call hash, and a build whose passes spill
// every weight makes the very weights of a build in memory, for every device and precision.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "../models/parity_util.h"
#include "builder/builder.h"
#include "io/hash.h"
#include "io/weight_spill.h"

namespace kiln::test {
namespace {

const Logger kQuiet(LogLevel::kSilent);

std::string spill_dir() {
  const std::string d = std::string(KILN_TEST_TMP) + "/spill_" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  return d;
}

TEST(Hash64Test, PiecesGiveTheOneCallHash) {
  std::mt19937 rng(7);
  std::vector<unsigned char> bytes(1000);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (size_t n : {0, 1, 31, 32, 33, 64, 95, 1000})
    for (size_t split : {size_t{0}, size_t{1}, size_t{17}, size_t{32}, n / 2, n}) {
      if (split > n) continue;
      Hash64 h(5);
      h.update(bytes.data(), split);
      h.update(bytes.data() + split, n - split);
      EXPECT_EQ(h.digest(), hash64(bytes.data(), n, 5)) << n << " split at " << split;
    }
  // Different bytes, different hashes (the streamed path is not a constant).
  EXPECT_NE(hash64(bytes.data(), 1000), hash64(bytes.data() + 1, 999));
}

TEST(WeightSpillTest, SpilledTensorsReadBackTheirBytes) {
  auto spill = WeightSpill::create(spill_dir(), 4096);
  Tensor big = Tensor::empty(DType::kF32, {3, 1000});
  for (int64_t i = 0; i < big.numel(); ++i) big.data<float>()[i] = static_cast<float>(i) * 0.5f;
  const Tensor copy = big.clone();
  const Tensor out = spill->put(std::move(big));
  EXPECT_TRUE(out.file_backed());
  EXPECT_FALSE(out.owns_memory());
  ASSERT_EQ(out.shape(), copy.shape());
  EXPECT_EQ(std::memcmp(out.raw(), copy.raw(), copy.nbytes()), 0);
  // Released pages come back from the file.
  out.release_pages();
  EXPECT_EQ(std::memcmp(out.raw(), copy.raw(), copy.nbytes()), 0);
  EXPECT_EQ(spill->bytes_written(), static_cast<int64_t>(copy.nbytes()));
  // Small tensors and views are not spilled.
  Tensor small = Tensor::empty(DType::kF32, {4});
  EXPECT_FALSE(spill->put(small).file_backed());
  EXPECT_FALSE(spill->put(out.slice_rows(0, 1)).owns_memory());
  EXPECT_EQ(spill->bytes_written(), static_cast<int64_t>(copy.nbytes()));
}

TEST(WeightSpillTest, BadInputAMissingFolderIsNamed) {
  try {
    WeightSpill::create("/nonexistent/kiln-spill");
    FAIL() << "created a spill file in a missing folder";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/kiln-spill"), std::string::npos) << e.what();
  }
}

// Every weight a pass makes goes through the spill (no size threshold), and the plan's weights
// are those of a build that kept them in memory.
TEST(WeightSpillTest, BuildsWithSpilledWeightsMakeTheSameWeights) {
  struct Case {
    const char* model;
    Device device;
    Precision precision;
  };
  for (const Case& c : {Case{"t5-tiny", Device::kCpu, Precision::kFp32},
                        Case{"t5-tiny", Device::kCpu, Precision::kInt8Weight},
                        Case{"bloom-tiny", Device::kCpu, Precision::kBf16},
                        Case{"bloom-tiny", Device::kCuda, Precision::kFp16},
                        Case{"t5-tiny", Device::kCuda, Precision::kBf16}}) {
    SCOPED_TRACE(std::string(c.model) + " " + std::string(device_name(c.device)) + " " +
                 std::string(precision_name(c.precision)));
    BuildOptions o;
    o.device = c.device;
    o.precision = c.precision;
    o.pack_for_cpu = CpuIsa::kAvx512;
    const ModelIR plain = build_model(fixture(c.model), o, kQuiet);
    auto spill = WeightSpill::create(spill_dir(), 1);
    ModelIR spilled;
    {
      WeightSpill::Scope scope(spill);
      spilled = build_model(fixture(c.model), o, kQuiet);
    }
    EXPECT_GT(spill->bytes_written(), 0);
    ASSERT_EQ(plain.graphs.size(), spilled.graphs.size());
    int file_backed = 0;
    for (size_t g = 0; g < plain.graphs.size(); ++g) {
      const Graph& a = plain.graphs[g];
      const Graph& b = spilled.graphs[g];
      ASSERT_EQ(a.values.size(), b.values.size());
      for (size_t v = 0; v < a.values.size(); ++v) {
        if (a.values[v].kind != ValueKind::kWeight) continue;
        const Tensor& x = a.values[v].data;
        const Tensor& y = b.values[v].data;
        ASSERT_EQ(x.dtype(), y.dtype()) << a.values[v].name;
        ASSERT_EQ(x.shape(), y.shape()) << a.values[v].name;
        EXPECT_EQ(a.values[v].layout, b.values[v].layout) << a.values[v].name;
        EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << a.values[v].name;
        file_backed += y.file_backed();
      }
    }
    EXPECT_GT(file_backed, 0);
  }
}

}  // namespace
}  // namespace kiln::test
