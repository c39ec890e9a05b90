// Token selection on the host: TokenSelector's own methods.
#include "backend/token_selector.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln {

// A backend that computes as it is called: the argmax runs at the start, its ids stay on the
// host.
bool TokenSelector::start_argmax_rows(const Tensor& logits, std::span<const int64_t> banned,
                                      std::span<const uint8_t> banned_rows, Tensor* ids) {
  started_ids_.assign(logits.rank() == 2 ? static_cast<size_t>(logits.dim(0)) : 0, -1);
  if (!argmax_rows(logits, started_ids_, banned, banned_rows)) return false;
  *ids = Tensor::from_vector(started_ids_, {static_cast<int64_t>(started_ids_.size())});
  return true;
}

void TokenSelector::finish_argmax_rows(std::span<int64_t> out) {
  KILN_CHECK(out.size() == started_ids_.size(), "finish_argmax_rows: {} outputs for {} rows",
             out.size(), started_ids_.size());
  std::copy(started_ids_.begin(), started_ids_.end(), out.begin());
}

Tensor TokenSelector::gather_ids(const Tensor& ids, std::span<const int64_t> keep,
                                 std::span<const int64_t> tail) {
  KILN_CHECK(ids.device() == Device::kCpu && ids.dtype() == DType::kI64 && ids.rank() == 1,
             "gather_ids: {} {} ids {} (this selector gathers host ids)", device_name(ids.device()),
             dtype_name(ids.dtype()), shape_str(ids.shape()));
  const auto* src = static_cast<const int64_t*>(ids.raw());
  std::vector<int64_t> out;
  out.reserve(keep.size() + tail.size());
  for (int64_t row : keep) {
    KILN_CHECK(row >= 0 && row < ids.dim(0), "gather_ids: row {} of {} ids", row, ids.dim(0));
    out.push_back(src[row]);
  }
  out.insert(out.end(), tail.begin(), tail.end());
  const int64_t n = static_cast<int64_t>(out.size());
  return Tensor::from_vector(std::move(out), {n});
}

void check_row_edits(const Tensor& logits, std::span<const RowEdit> edits) {
  KILN_CHECK(logits.rank() == 2 && logits.dtype() == DType::kF32,
             "edit_logits_rows: logits must be [rows, vocab] f32");
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  for (const RowEdit& e : edits) {
    KILN_CHECK(e.row >= 0 && e.row < rows, "edit_logits_rows: row {} outside the {} rows", e.row,
               rows);
    KILN_CHECK(e.penalty > 0.0f && std::isfinite(e.penalty),
               "edit_logits_rows: repetition penalty {} (must be > 0)", e.penalty);
    for (const std::vector<int64_t>* ids : {&e.penalized, &e.banned, &e.forced, &e.suppressed})
      for (int64_t id : *ids)
        KILN_CHECK(id >= 0 && id < vocab, "edit_logits_rows: token id {} outside [0, {})", id,
                   vocab);
  }
}

void edit_logits_row(std::span<float> x, const RowEdit& e) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (e.log_softmax) {
    // As the runtime's log_softmax (fp32 sum of exp(x - max)).
    const float mx = *std::max_element(x.begin(), x.end());
    float sum = 0.0f;
    for (float v : x) sum += std::exp(v - mx);
    const float lse = mx + std::log(sum);
    for (float& v : x) v -= lse;
  }
  for (int64_t id : e.penalized) {
    float& v = x[static_cast<size_t>(id)];
    v = v < 0.0f ? v * e.penalty : v / e.penalty;
  }
  for (int64_t id : e.banned) x[static_cast<size_t>(id)] = kNegInf;
  if (!e.forced.empty()) {
    std::fill(x.begin(), x.end(), kNegInf);
    for (int64_t id : e.forced) x[static_cast<size_t>(id)] = 0.0f;
  }
  for (int64_t id : e.suppressed) x[static_cast<size_t>(id)] = kNegInf;
}

void TokenSelector::edit_logits_rows(Tensor& logits, std::span<const RowEdit> edits) {
  if (edits.empty()) return;
  KILN_CHECK(logits.device() == Device::kCpu,
             "edit_logits_rows: this selector has no kernel for {} logits",
             device_name(logits.device()));
  check_row_edits(logits, edits);
  const size_t vocab = static_cast<size_t>(logits.dim(1));
  for (const RowEdit& e : edits)
    edit_logits_row(std::span<float>(logits.data<float>() + e.row * logits.dim(1), vocab), e);
}

}  // namespace kiln
