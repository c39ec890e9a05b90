// Helpers of the ONNX lifting tests: the fixture exports and onnxruntime's outputs
// (../shared/fixtures/onnx), lifted plans built from them, and errors at real positions.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "builder/builder.h"
#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/run_import_graph.h"
#include "io/safetensors.h"
#include "runtime/forward.h"

namespace kiln::lift_test {

inline const std::string kOnnxDir = std::string(KILN_FIXTURES_DIR) + "/onnx";
inline const std::string kBloomTokenizer =
    std::string(KILN_FIXTURES_DIR) + "/bloom-tiny/tokenizer.json";
inline const std::string kT5Tokenizer = std::string(KILN_FIXTURES_DIR) + "/t5-tiny/spiece.model";

inline const SafetensorsFile& reference() {
  static const SafetensorsFile ref = SafetensorsFile::open(kOnnxDir + "/reference.safetensors");
  return ref;
}
inline const Tensor& fx(const std::string& name) { return reference().tensors().at(name); }

inline std::vector<float> floats(const Tensor& t) {
  const Tensor f = t.to_f32();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

inline std::vector<int64_t> ints(const Tensor& t) {
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

inline ImportGraph import(const std::string& file) {
  return ImportGraph::build(read_onnx_model(kOnnxDir + "/" + file));
}

inline std::unique_ptr<CompiledModel> compile(Context& ctx, const std::vector<std::string>& files,
                                              const std::string& tokenizer) {
  std::vector<std::string> paths;
  for (const std::string& f : files) paths.push_back(kOnnxDir + "/" + f);
  return std::make_unique<CompiledModel>(
      ctx, build_model_from_onnx(paths, tokenizer, BuildOptions{}, ctx.log()));
}

// Row r of a [b, s] integer tensor where `mask` (same shape) is nonzero.
inline std::vector<int64_t> real_tokens(const Tensor& ids, const Tensor& mask, int64_t r) {
  std::vector<int64_t> out;
  const int64_t s = ids.dim(1);
  for (int64_t i = 0; i < s; ++i)
    if (mask.data<int64_t>()[r * s + i] != 0) out.push_back(ids.data<int64_t>()[r * s + i]);
  return out;
}

struct Error_ {
  double max_abs = 0, max_ref = 0;
};
// Compares row r's real positions of `full` ([b, s, w], from the interpreter or onnxruntime)
// with the plan's rows ([n, w], one per real position in order).
inline void accumulate(Error_& e, const std::vector<float>& full, int64_t s, int64_t w, int64_t r,
                       const std::vector<int64_t>& positions, const Tensor& plan_rows) {
  const Tensor p = plan_rows.to_f32();
  ASSERT_EQ(p.numel(), static_cast<int64_t>(positions.size()) * w);
  for (size_t i = 0; i < positions.size(); ++i)
    for (int64_t j = 0; j < w; ++j) {
      const double want = full[(r * s + positions[i]) * w + j];
      const double got = p.data<float>()[static_cast<int64_t>(i) * w + j];
      e.max_abs = std::max(e.max_abs, std::fabs(got - want));
      e.max_ref = std::max(e.max_ref, std::fabs(want));
    }
}

inline std::vector<int64_t> positions_of(const Tensor& mask, int64_t r) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < mask.dim(1); ++i)
    if (mask.data<int64_t>()[r * mask.dim(1) + i] != 0) out.push_back(i);
  return out;
}

inline void report(const std::string& what, const Error_& e) {
  EXPECT_GT(e.max_ref, 0) << what;
  EXPECT_LE(e.max_abs, 1e-4 * e.max_ref) << what;
  std::printf("[ lift     ] %s: max abs error %.3g, max |ref| %.3g (relative %.3g)\n", what.c_str(),
              e.max_abs, e.max_ref, e.max_abs / e.max_ref);
}

// The plan `engine` of a BLOOM export (`graph`, imported) on the fixture's BLOOM inputs
// (bloom.in.*), row by row at the real positions, against the interpreter's logits of `graph`
// and, with `vs_onnxruntime`, onnxruntime's of the fixture export (the same function): each
// within report()'s bound, named `what`.
inline void check_bloom_plan(CompiledModel& engine, const ImportGraph& graph,
                             const std::string& what, bool vs_onnxruntime) {
  const Tensor& ids = fx("bloom.in.input_ids");
  const Tensor& mask = fx("bloom.in.attention_mask");
  const std::vector<float> interp =
      run_import_graph(graph,
                       {{"input_ids", ImportTensor::from_tensor(OnnxElemType::kInt64, ids)},
                        {"attention_mask", ImportTensor::from_tensor(OnnxElemType::kInt64, mask)}})
          .at("logits")
          .to_floats();
  const std::vector<float> ort = floats(fx("bloom.out.logits"));
  const int64_t s = ids.dim(1), vocab = engine.desc().vocab_size;
  ASSERT_EQ(static_cast<int64_t>(ort.size()), ids.dim(0) * s * vocab);
  Error_ vs_interp, vs_ort;
  for (int64_t r = 0; r < ids.dim(0); ++r) {
    const Tensor logits = run_forward(engine, {}, real_tokens(ids, mask, r), false).logits;
    accumulate(vs_interp, interp, s, vocab, r, positions_of(mask, r), logits);
    accumulate(vs_ort, ort, s, vocab, r, positions_of(mask, r), logits);
  }
  report(what + ", plan vs interpreter", vs_interp);
  if (vs_onnxruntime) report(what + ", plan vs onnxruntime", vs_ort);
}

// The last row's argmax; with `no_repeat`, over the tokens not in `seq` (HF's
// no_repeat_ngram_size 1).
inline int64_t argmax_last(const std::vector<float>& logits, int64_t vocab,
                           const std::vector<int64_t>& seq, bool no_repeat) {
  const int64_t base = static_cast<int64_t>(logits.size()) - vocab;
  int64_t best = -1;
  for (int64_t v = 0; v < vocab; ++v) {
    if (no_repeat && std::find(seq.begin(), seq.end(), v) != seq.end()) continue;
    if (best < 0 || logits[base + v] > logits[base + best]) best = v;
  }
  return best;
}

inline ImportTensor int_tensor(const std::vector<int64_t>& v) {
  return ImportTensor::from_vector(OnnxElemType::kInt64, {1, static_cast<int64_t>(v.size())}, v);
}
inline ImportTensor ones(int64_t n) {
  return int_tensor(std::vector<int64_t>(static_cast<size_t>(n), 1));
}

}  // namespace kiln::lift_test
