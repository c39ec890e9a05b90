// Relative-position buckets and ALiBi slopes against values computed from HuggingFace's formulas
// (T5Attention._relative_position_bucket, build_alibi_tensor) by hand / in Python.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/position_bias.h"

namespace kiln {
namespace {

struct BucketCase {
  int64_t relative;  // key position - query position
  int expected;
};

TEST(RelativeBuckets, BidirectionalT5Default) {
  // num_buckets 32, max_distance 128: 16 per direction, exact below 8, log-spaced up to 128.
  const BucketCase cases[] = {{-1000, 15}, {-200, 15}, {-128, 15}, {-127, 15}, {-100, 15},
                              {-40, 12},   {-20, 10},  {-9, 8},    {-8, 8},    {-7, 7},
                              {-1, 1},     {0, 0},     {1, 17},    {2, 18},    {7, 23},
                              {8, 24},     {9, 24},    {20, 26},   {40, 28},   {100, 31},
                              {127, 31},   {128, 31},  {200, 31},  {1000, 31}};
  for (const BucketCase& c : cases)
    EXPECT_EQ(t5_relative_bucket(c.relative, true, 32, 128), c.expected) << c.relative;
}

TEST(RelativeBuckets, CausalDecoder) {
  // Future keys (relative > 0) all map to bucket 0; the past uses all 32 buckets.
  const BucketCase cases[] = {{-1000, 31}, {-200, 31}, {-128, 31}, {-127, 31}, {-100, 30},
                              {-64, 26},   {-40, 23},  {-20, 17},  {-9, 9},    {-8, 8},
                              {-7, 7},     {-1, 1},    {0, 0},     {1, 0},     {100, 0}};
  for (const BucketCase& c : cases)
    EXPECT_EQ(t5_relative_bucket(c.relative, false, 32, 128), c.expected) << c.relative;
}

TEST(RelativeBuckets, SmallTableBeyondMaxDistance) {
  const BucketCase cases[] = {{-1000, 3}, {-20, 3}, {-7, 3}, {-1, 1}, {0, 0},
                              {1, 5},     {2, 6},   {7, 7},  {20, 7}, {1000, 7}};
  for (const BucketCase& c : cases)
    EXPECT_EQ(t5_relative_bucket(c.relative, true, 8, 20), c.expected) << c.relative;
}

TEST(Alibi, PowerOfTwoHeads) {
  const std::vector<float> s = alibi_slopes(8);
  ASSERT_EQ(s.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(s[h], std::ldexp(1.0f, -(h + 1))) << h;
}

TEST(Alibi, NonPowerOfTwoHeadsInterleave) {
  // 6 heads: the 4-head series (base 1/4) then odd powers of the 8-head base (1/2).
  const std::vector<float> expected = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
  EXPECT_EQ(alibi_slopes(6), expected);
  // 12 heads: 8-head series (base 1/2) then 1/sqrt(2) to the powers 1, 3, 5, 7.
  const std::vector<float> s12 = alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  EXPECT_NEAR(s12[8], std::pow(2.0, -0.5), 1e-7);
  EXPECT_NEAR(s12[11], std::pow(2.0, -3.5), 1e-7);
}

}  // namespace
}  // namespace kiln
