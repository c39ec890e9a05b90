// Token selection where the logits live (TokenSelector::top_k_rows): each row's best ids after the
// temperature, with bans, ties and short rows, and the row's log-normaliser, against a host
// computation (std::stable_sort, as the sampler sorts; log-sum-exp in double); and the greedy
// argmax over many rows with per-row bans (TokenSelector::argmax_rows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend_ops.h"

namespace kiln::test {
namespace {

struct Expected {
  std::vector<int64_t> ids;
  std::vector<float> values;
  double log_norm;
};

Expected host_top_k(std::span<const float> row, int k, float temperature,
                    std::span<const int64_t> banned) {
  std::vector<float> scaled(row.begin(), row.end());
  for (float& v : scaled) v /= temperature;
  std::vector<int64_t> order;
  for (int64_t c = 0; c < static_cast<int64_t>(row.size()); ++c)
    if (std::find(banned.begin(), banned.end(), c) == banned.end()) order.push_back(c);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scaled[a] > scaled[b]; });
  Expected e;
  for (int j = 0; j < k; ++j) {
    const bool in = j < static_cast<int>(order.size());
    e.ids.push_back(in ? order[j] : -1);
    e.values.push_back(in ? scaled[order[j]] : -INFINITY);
  }
  double mx = -INFINITY, sum = 0.0;
  for (float v : row) mx = std::max(mx, static_cast<double>(v));
  for (float v : row) sum += std::exp(v - mx);
  e.log_norm = mx + std::log(sum);
  return e;
}

void check_top_k(int64_t rows, int64_t cols, int k, uint32_t seed) {
  Gen g(DType::kF32, DType::kF32, seed);
  std::vector<float> v = g.floats(rows * cols, -8, 8);
  // Coarse values make ties across chunks of the device kernel (4096 columns each).
  for (float& x : v) x = std::round(x * 4.0f) / 4.0f;
  const std::vector<float> temperature = {1.0f, 0.7f, 1.3f, 0.3f, 2.0f, 1.0f};
  const std::vector<int64_t> banned = {3, cols - 1, 4100 % cols};
  std::vector<uint8_t> flagged(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; r += 2) flagged[r] = 1;
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    if (nb.backend->token_selector().max_top_k() < k)
      continue;  // host backends read logits directly
    const Tensor logits = nb.backend->allocator().upload(Tensor::from_vector(v, {rows, cols}));
    const std::span<const float> temps(temperature.data(), static_cast<size_t>(rows));
    TopKRows got;
    ASSERT_TRUE(nb.backend->token_selector().top_k_rows(logits, k, temps, banned, flagged, &got))
        << nb.name;
    ASSERT_EQ(got.k, k);
    for (int64_t r = 0; r < rows; ++r) {
      const std::span<const float> row(v.data() + r * cols, static_cast<size_t>(cols));
      const Expected e =
          host_top_k(row, k, temperature[r],
                     flagged[r] ? std::span<const int64_t>(banned) : std::span<const int64_t>());
      const std::vector<int64_t> ids(got.ids.begin() + r * k, got.ids.begin() + (r + 1) * k);
      const std::vector<float> values(got.values.begin() + r * k, got.values.begin() + (r + 1) * k);
      EXPECT_EQ(ids, e.ids) << nb.name << " row " << r;
      EXPECT_EQ(values, e.values) << nb.name << " row " << r;
      EXPECT_NEAR(got.log_norm[r], e.log_norm, 1e-5 * std::abs(e.log_norm)) << nb.name << r;
    }
    // Without temperatures and bans: plain logits; k = 1 is the argmax.
    TopKRows plain;
    ASSERT_TRUE(nb.backend->token_selector().top_k_rows(logits, 1, {}, {}, {}, &plain)) << nb.name;
    std::vector<int64_t> argmax(static_cast<size_t>(rows), -1);
    if (nb.backend->token_selector().argmax_rows(logits, argmax)) {
      EXPECT_EQ(plain.ids, argmax) << nb.name;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const std::span<const float> row(v.data() + r * cols, static_cast<size_t>(cols));
      EXPECT_EQ(plain.values[r], *std::max_element(row.begin(), row.end())) << nb.name << r;
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no backend here selects tokens on a device (CUDA does)";
}

TEST(BackendOps, TopKRowsOnTheDeviceMatchTheSamplersOrder) {
  check_top_k(6, 10000, 50, 11);  // three chunks, ties across them
}

TEST(BackendOps, TopKRowsBeamWidthOverAWideRow) {
  check_top_k(4, 250880, 8, 12);  // bloom's vocabulary, 2 x 4 beams
}

TEST(BackendOps, TopKRowsShorterThanKEndWithNoIds) {
  check_top_k(3, 40, 64, 13);  // 40 columns, some banned: the rest of the 64 are -1
}

TEST(BackendOps, TopKRowsAtTheLargestK) {
  for (NamedBackend& nb : available_backends()) {
    const int k = nb.backend->token_selector().max_top_k();
    if (k == 0) continue;
    check_top_k(2, 5000, k, 14);
    return;
  }
  GTEST_SKIP() << "no backend here selects tokens on a device (CUDA does)";
}

// The greedy argmax over many rows: the rows' ban flags travel as bits of the kernel's
// parameters up to RowMask::kRows rows (words of 64: rows 63, 64, 127 and 128 on both sides of a
// boundary) and as device bytes beyond. Against a host scan.
// `cols`: 8200 is two chunks of the device kernel (8192 f32 columns), the second of 8 columns;
// 8195 the same in rows not 16-byte aligned (its value-by-value loads).
void check_argmax_many_rows(int64_t rows, int64_t cols, uint32_t seed) {
  Gen g(DType::kF32, DType::kF32, seed);
  std::vector<float> v = g.floats(rows * cols, -6, 6);
  std::vector<uint8_t> flagged(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) flagged[r] = r % 3 == 0 || r == 63 || r == 64 || r == 127;
  // Each flagged row bans its own best column and, in the last chunk, column cols - 2: the
  // banned ids are the same for all rows, so plant the best in a shared column.
  const std::vector<int64_t> banned = {7, cols - 2};
  for (int64_t r = 0; r < rows; ++r) v[r * cols + 7] = 50.0f + static_cast<float>(r % 5);
  std::vector<int64_t> expected(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = -1;
    for (int64_t c = 0; c < cols; ++c) {
      if (flagged[r] && (c == banned[0] || c == banned[1])) continue;
      if (best < 0 || v[r * cols + c] > v[r * cols + best]) best = c;
    }
    expected[r] = best;
  }
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    const Tensor logits = nb.backend->allocator().upload(Tensor::from_vector(v, {rows, cols}));
    std::vector<int64_t> got(static_cast<size_t>(rows), -2);
    if (!nb.backend->token_selector().argmax_rows(logits, got, banned, flagged)) continue;
    EXPECT_EQ(got, expected) << nb.name << ", " << rows << " rows";
    for (int64_t r = 0; r < rows; ++r) {
      if (!flagged[r]) {
        ASSERT_EQ(got[r], 7) << nb.name << " row " << r;
      }
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no backend here computes argmax on a device (CUDA does)";
}

TEST(BackendOps, ArgmaxRowsFlagsAsBitsAcrossWordBoundaries) {
  check_argmax_many_rows(130, 8200, 21);
}

TEST(BackendOps, ArgmaxRowsFlagsInDeviceMemoryPastTheMask) {
  check_argmax_many_rows(600, 8200, 22);
}

TEST(BackendOps, ArgmaxRowsBansOnUnalignedRows) { check_argmax_many_rows(70, 8195, 23); }

// The device argmax is one kernel: each row's last block to finish reduces the row, found by a
// counter per row that it leaves at zero for the next launch. Launches of other row and chunk
// counts in between (a row counter of one launch is another row's of the next) must not leave a
// count behind: every launch's ids against a host scan. Rows of whole 16-byte vectors take the
// kernel's vector loads, others its value-by-value ones.
TEST(BackendOps, ArgmaxRowsRepeatedWithOtherShapes) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {3, 9000},
      {7, 4096},
      {1, 250880},
      {3, 9000},
      {12, 5000},
      {7, 4096},
      {1, 250880},
      // Rows that do not start 16-byte aligned (the kernel's value-by-value loads): one chunk,
      // three, two (the second of 2 columns).
      {5, 4099},
      {3, 16390},
      {2, 8194}};
  Gen g(DType::kF32, DType::kF32, 31);
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    bool device = true;
    for (const auto& [rows, cols] : shapes) {
      const std::vector<float> v = g.floats(rows * cols, -8, 8);
      std::vector<int64_t> expected(static_cast<size_t>(rows), 0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 1; c < cols; ++c)
          if (v[r * cols + c] > v[r * cols + expected[r]]) expected[r] = c;
      const Tensor logits = nb.backend->allocator().upload(Tensor::from_vector(v, {rows, cols}));
      std::vector<int64_t> got(static_cast<size_t>(rows), -2);
      if (!nb.backend->token_selector().argmax_rows(logits, got)) {
        device = false;
        break;
      }
      EXPECT_EQ(got, expected) << nb.name << ", " << rows << " x " << cols;
    }
    checked += device ? 1 : 0;
  }
  if (checked == 0) GTEST_SKIP() << "no backend here computes argmax on a device (CUDA does)";
}

}  // namespace
}  // namespace kiln::test
