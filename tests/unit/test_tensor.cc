// Tensor views: view_at shares its source's storage at a byte offset, checked against the
// storage's size.
#include <gtest/gtest.h>

#include "core/tensor.h"

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

}  // namespace
}  // namespace kiln
