// Tensor views: view_at shares its source's storage at a byte offset, checked against the
// storage's size.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/f32_chunks.h"
#include "core/tensor.h"
#include "io/mmap_file.h"

namespace kiln {
namespace {

TEST(Tensor, ViewAtSharesTheStorageAtAByteOffset) {
  Tensor buffer = Tensor::empty(DType::kI8, {64});
  for (int i = 0; i < 64; ++i) buffer.data<int8_t>()[i] = static_cast<int8_t>(i);
  const Tensor v = buffer.view_at(DType::kI8, {2, 3}, 10);
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.raw(), buffer.data<int8_t>() + 10);
  EXPECT_EQ(v.data<int8_t>()[5], 15);
  // Offsets add up through a view of a view, and the storage outlives the first tensor.
  Tensor inner = v.view_at(DType::kI8, {4}, 2);
  buffer = Tensor();
  EXPECT_EQ(inner.data<int8_t>()[0], 12);
  EXPECT_EQ(inner.data<int8_t>()[3], 15);
}

TEST(Tensor, BadInputViewAtPastTheStorageIsRefused) {
  const Tensor buffer = Tensor::empty(DType::kF32, {16});  // 64 bytes
  EXPECT_NO_THROW(buffer.view_at(DType::kF32, {4}, 48));
  EXPECT_THROW(buffer.view_at(DType::kF32, {4}, 52), Error);
  EXPECT_THROW(buffer.view_at(DType::kF32, {17}, 0), Error);
  EXPECT_THROW(Tensor().view_at(DType::kF32, {1}, 0), Error);
}

// Conversions go a chunk (2^20 elements) at a time and give a mapped source's pages back as they
// go: the values are those of converting element by element, across chunk boundaries and a
// tail, and the mapped source still reads its values afterwards (the pages come back from the
// file).
TEST(Tensor, ConversionsOfAMappedTensorAreChunkedAndExact) {
  const int64_t n = (int64_t{1} << 21) + 777;
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] = std::sin(static_cast<float>(i) * 0.001f) * 1000.0f;
  const Tensor f16 = Tensor::from_vector(values, {n}).to(DType::kF16);
  const std::string dir = std::string(KILN_TEST_TMP) + "/tensor_convert";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/f16.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(static_cast<const char*>(f16.raw()), static_cast<std::streamsize>(f16.nbytes()));
  }
  auto file = MappedFile::open(path);
  const Tensor mapped = Tensor::mapped(DType::kF16, {n}, file->data(), file);
  ASSERT_TRUE(mapped.file_backed());
  const Tensor bf16 = mapped.to(DType::kBF16);
  const Tensor f32 = mapped.to_f32();
  const DTypeTraits& h = dtype_traits(DType::kF16);
  const DTypeTraits& b = dtype_traits(DType::kBF16);
  for (int64_t i :
       {int64_t{0}, int64_t{1} << 20, (int64_t{1} << 20) - 1, (int64_t{1} << 21) + 5, n - 1}) {
    float one = 0.0f;
    h.to_float(static_cast<const uint16_t*>(f16.raw()) + i, &one, 1);
    EXPECT_EQ(f32.data<float>()[i], one) << i;
    uint16_t expect = 0;
    b.from_float(&one, &expect, 1);
    EXPECT_EQ(static_cast<const uint16_t*>(bf16.raw())[i], expect) << i;
  }
  for (int64_t i = 0; i < n; i += 4099) {
    float one = 0.0f, back = 0.0f;
    h.to_float(static_cast<const uint16_t*>(f16.raw()) + i, &one, 1);
    b.to_float(static_cast<const uint16_t*>(bf16.raw()) + i, &back, 1);
    ASSERT_EQ(f32.data<float>()[i], one) << i;
    ASSERT_NEAR(back, one, std::fabs(one) / 128.0f) << i;
    ASSERT_EQ(static_cast<const uint16_t*>(mapped.raw())[i],
              static_cast<const uint16_t*>(f16.raw())[i])
        << i;
  }
}

// for_each_f32_chunk: consecutive chunks, the last one shorter, the values those of to_f32; an
// f32 tensor's values are the tensor itself; a visitor that returns false stops the walk.
TEST(F32Chunks, ChunksCoverTheTensorInOrderAsF32) {
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f - 7.0f;
  const Tensor f32 = Tensor::from_vector(values, {10, 100});
  const Tensor bf16 = f32.to(DType::kBF16);
  const Tensor widened = bf16.to_f32();
  std::vector<size_t> firsts, counts;
  std::vector<float> seen;
  EXPECT_TRUE(for_each_f32_chunk(bf16, 300, [&](const float* v, size_t first, size_t n) {
    firsts.push_back(first);
    counts.push_back(n);
    seen.insert(seen.end(), v, v + n);
    return true;
  }));
  EXPECT_EQ(firsts, (std::vector<size_t>{0, 300, 600, 900}));
  EXPECT_EQ(counts, (std::vector<size_t>{300, 300, 300, 100}));
  ASSERT_EQ(seen.size(), values.size());
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], widened.data<float>()[i]) << i;
  const float* first_values = nullptr;
  int calls = 0;
  EXPECT_FALSE(for_each_f32_chunk(f32, 400, [&](const float* v, size_t, size_t) {
    if (calls++ == 0) first_values = v;
    return calls < 2;
  }));
  EXPECT_EQ(calls, 2) << "the walk stops where the visitor says";
  EXPECT_EQ(first_values, f32.data<float>()) << "an f32 tensor is read in place";
}

TEST(F32Chunks, BadInputEmptyChunksAndChunksThatSplitABlockAreRefused) {
  const Tensor i4 = Tensor::empty(DType::kI4, {4, 8});
  const auto visit = [](const float*, size_t, size_t) { return true; };
  EXPECT_THROW(for_each_f32_chunk(i4, 3, visit), std::exception);
  EXPECT_THROW(for_each_f32_chunk(Tensor::empty(DType::kF32, {4}), 0, visit), std::exception);
}

}  // namespace
}  // namespace kiln
