#include "backend/step.h"

#include <algorithm>

#include "core/status.h"

namespace kiln {

void StepLayout::clear() {
  token_begin.assign(1, 0);
  past_len.clear();
  max_blocks = 0;
  block_table.clear();
  cross.clear();
  copies.clear();
}

void StepLayout::add_sequence(int64_t tokens, int64_t past, std::span<const int32_t> blocks,
                              const CrossKv* cross_kv) {
  if (token_begin.empty()) token_begin.push_back(0);
  const int32_t width = std::max<int32_t>(max_blocks, static_cast<int32_t>(blocks.size()));
  if (width > max_blocks) {
    // Widen the table: re-lay the existing rows with -1 padding.
    std::vector<int32_t> wider(static_cast<size_t>(num_seqs()) * width, -1);
    for (int s = 0; s < num_seqs(); ++s)
      std::copy_n(block_table.begin() + static_cast<ptrdiff_t>(s) * max_blocks, max_blocks,
                  wider.begin() + static_cast<ptrdiff_t>(s) * width);
    block_table = std::move(wider);
    max_blocks = width;
  }
  token_begin.push_back(static_cast<int32_t>(token_begin.back() + tokens));
  past_len.push_back(static_cast<int32_t>(past));
  const size_t row = block_table.size();
  block_table.resize(row + static_cast<size_t>(max_blocks), -1);
  std::copy(blocks.begin(), blocks.end(), block_table.begin() + static_cast<ptrdiff_t>(row));
  cross.push_back(cross_kv);
}

void StepLayout::check(int block_size) const {
  const int n = num_seqs();
  KILN_CHECK(static_cast<int>(token_begin.size()) == n + 1 && static_cast<int>(cross.size()) == n &&
                 block_table.size() == static_cast<size_t>(n) * max_blocks,
             "step layout: inconsistent array sizes for {} sequences", n);
  for (int s = 0; s < n; ++s) {
    KILN_CHECK(num_tokens(s) >= 0 && past_len[s] >= 0, "step layout: sequence {} is malformed", s);
    if (block_size <= 0) continue;
    const int64_t need = (past_len[s] + num_tokens(s) + block_size - 1) / block_size;
    KILN_CHECK(need <= max_blocks && (need == 0 || blocks(s)[need - 1] >= 0),
               "step layout: sequence {} needs {} blocks for {} positions", s, need,
               past_len[s] + num_tokens(s));
  }
}

}  // namespace kiln
