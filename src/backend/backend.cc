// The Backend interface's default behaviour.
#include "backend/backend.h"

#include <algorithm>

namespace kiln {

// A backend that computes as it is called: the argmax runs at the start, its ids stay on the
// host.
bool Backend::start_argmax_rows(const Tensor& logits, std::span<const int64_t> banned,
                                std::span<const uint8_t> banned_rows, Tensor* ids) {
  started_ids_.assign(logits.rank() == 2 ? static_cast<size_t>(logits.dim(0)) : 0, -1);
  if (!argmax_rows(logits, started_ids_, banned, banned_rows)) return false;
  *ids = Tensor::from_vector(started_ids_, {static_cast<int64_t>(started_ids_.size())});
  return true;
}

void Backend::finish_argmax_rows(std::span<int64_t> out) {
  KILN_CHECK(out.size() == started_ids_.size(), "finish_argmax_rows: {} outputs for {} rows",
             out.size(), started_ids_.size());
  std::copy(started_ids_.begin(), started_ids_.end(), out.begin());
}

}  // namespace kiln
