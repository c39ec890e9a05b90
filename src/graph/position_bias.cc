#include "graph/position_bias.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace kiln {

int t5_relative_bucket(int64_t relative_position, bool bidirectional, int num_buckets,
                       int max_distance) {
  int bucket = 0;
  int64_t n = relative_position;
  if (bidirectional) {
    num_buckets /= 2;
    if (n > 0) bucket += num_buckets;
    n = std::llabs(n);
  } else {
    n = -std::min<int64_t>(n, 0);
  }
  const int max_exact = num_buckets / 2;
  if (n < max_exact) return bucket + static_cast<int>(n);
  // PyTorch: log(float(n) / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact),
  // each step in float32, then .to(long) truncates.
  const float ratio = static_cast<float>(n) / static_cast<float>(max_exact);
  const float denom = static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact));
  const float scaled = std::log(ratio) / denom * static_cast<float>(num_buckets - max_exact);
  int64_t large = max_exact + static_cast<int64_t>(scaled);
  large = std::min<int64_t>(large, num_buckets - 1);
  return bucket + static_cast<int>(large);
}

std::vector<float> alibi_slopes(int num_heads) {
  const int closest = 1 << static_cast<int>(std::floor(std::log2(num_heads)));
  const float base = static_cast<float>(std::pow(2.0, -std::pow(2.0, -(std::log2(closest) - 3))));
  std::vector<float> slopes;
  for (int p = 1; p <= closest; ++p) slopes.push_back(std::pow(base, static_cast<float>(p)));
  if (closest != num_heads) {
    const float extra_base =
        static_cast<float>(std::pow(2.0, -std::pow(2.0, -(std::log2(2 * closest) - 3))));
    const int remaining = std::min(closest, num_heads - closest);
    for (int p = 1; p < 1 + 2 * remaining; p += 2)
      slopes.push_back(std::pow(extra_base, static_cast<float>(p)));
  }
  return slopes;
}

}  // namespace kiln
