// Helpers for HF-parity tests: reference tensors from ../shared/fixtures and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda_info.h"
#include "core/tensor.h"
#include "io/jsonl.h"
#include "io/safetensors.h"

namespace kiln::test {

inline std::string fixture(const std::string& rel) {
  return std::string(KILN_FIXTURES_DIR) + "/" + rel;
}

// Empty when a GPU is visible; otherwise why not ("no GPU visible (...)"), for CUDA tests to
// skip with.
inline std::string no_gpu_reason() {
  const CudaInfo cuda = query_cuda();
  if (cuda.device_count > 0) return {};
  return "no GPU visible (" + (cuda.compiled ? cuda.error : std::string("built without CUDA")) +
         ")";
}

inline std::vector<int64_t> ids_of(const Tensor& t) {
  const Tensor c = t.dtype() == DType::kI64 ? t : t.to(DType::kI64);
  return std::vector<int64_t>(c.data<int64_t>(), c.data<int64_t>() + c.numel());
}

// max |a - b| / max |ref|, the design's parity metric.
inline double relative_error(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  if (got.shape() != ref.shape()) return INFINITY;
  const Tensor a = got.to_f32(), b = ref.to_f32();
  double max_ref = 0.0, max_diff = 0.0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(b.data<float>()[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a.data<float>()[i]) -
                                            static_cast<double>(b.data<float>()[i])));
  }
  return max_ref == 0.0 ? max_diff : max_diff / max_ref;
}

// Cosine similarity of two rows of n floats (precision checks of logits).
inline double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// One row of a fixture model's tokenizer_reference.jsonl: a text and HF's ids for it.
struct ReferenceRow {
  std::string text;
  std::vector<int64_t> ids;
};
inline std::vector<ReferenceRow> load_tokenizer_reference(const std::string& model) {
  std::vector<ReferenceRow> rows;
  read_jsonl(fixture(model + "/tokenizer_reference.jsonl"), [&](const nlohmann::json& row, int) {
    rows.push_back({row.at("text").get<std::string>(), row.at("ids").get<std::vector<int64_t>>()});
  });
  return rows;
}

// Removes trailing occurrences of `token` (pad) and then one trailing EOS.
inline std::vector<int64_t> strip_generated(std::vector<int64_t> ids, int64_t eos, int64_t pad) {
  while (!ids.empty() && ids.back() == pad && pad != eos) ids.pop_back();
  if (!ids.empty() && ids.back() == eos) ids.pop_back();
  return ids;
}

}  // namespace kiln::test
