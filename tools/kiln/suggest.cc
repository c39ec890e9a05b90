// "Did you mean ...?" for unknown options, commands and names (closest_name in commands.h).
#include <algorithm>

#include "commands.h"

namespace kiln::cli {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string closest_name(const std::string& given, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = std::max<size_t>(2, given.size() / 3) + 1;
  for (const std::string& n : names) {
    size_t d = edit_distance(given, n);
    if (n.size() > given.size() && n.starts_with(given)) d = std::min<size_t>(d, 1);
    if (d < best_d) {
      best_d = d;
      best = n;
    }
  }
  return best;
}

}  // namespace kiln::cli
