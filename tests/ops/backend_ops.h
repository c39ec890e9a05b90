// The op test harness (after ggml's test-backend-ops): a table of op cases, each a small graph
// (one node, or the pair a pass fuses) with fixed-seed data and one or more steps, run on the
// reference backend and on every other backend this build and machine have, outputs compared
// with a per-dtype tolerance. The reference computes from the definitions in double; no test
// compares against numbers the fast kernels produced.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "graph/builder.h"

namespace kiln::test {

inline const Dim kTokens = Dim::sym("tokens");

// A backend under test, with the context that owns its threads.
struct NamedBackend {
  std::string name;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<Backend> backend;
  // Promises that a sequence's results do not depend on its batch (DESIGN.md: the CPU does).
  bool batch_invariant = false;
};

// The CPU backend whose bf16-weight Linears round their activations to bf16 (AVX512-BF16 dot
// products): compared with the reference on bf16-representable activations only.
inline constexpr const char* kBf16DotBackend = "cpu-avx512-bf16";
// The CPU backend whose i8-weight Linears quantize their activations to int8 (per row, in groups of
// 64; AVX512-VNNI dot products): compared with the reference on activations quantized the same way.
inline constexpr const char* kInt8DotBackend = "cpu-avx512-vnni";

// Every backend besides the reference that this build can run here: each CPU kernel family the
// machine supports (CUDA adds one line here once it has a backend).
std::vector<NamedBackend> available_backends();
std::unique_ptr<Backend> reference_backend();
// available_backends() and the reference (named "reference", no context of its own).
std::vector<NamedBackend> every_backend();

// Fixed-seed data in the dtype a case runs in. `values` may be narrower than `dtype`: a case
// built with (f32, f16) holds exactly the numbers its (f16, f16) twin holds, which is how the
// reference's narrow-dtype paths are checked against its f32 paths.
class Gen {
 public:
  Gen(DType dtype, DType values, uint32_t seed) : dtype_(dtype), values_(values), rng_(seed) {}
  DType dtype() const { return dtype_; }
  std::mt19937& rng() { return rng_; }
  // Uniform in [lo, hi), rounded to the values dtype.
  std::vector<float> floats(int64_t n, float lo = -1.0f, float hi = 1.0f);
  // `v` (rounded to the values dtype) as a tensor of dtype().
  Tensor tensor(const std::vector<float>& v, const Shape& shape) const;
  Tensor random(const Shape& shape, float lo = -1.0f, float hi = 1.0f);

 private:
  DType dtype_;
  DType values_;
  std::mt19937 rng_;
};
// A random int4 weight (graph/linear.h): i4 values over the whole range (both ends included) and
// f16 group scales [out, groups] of either sign (the quantizer's scales are m / -8, negative for a
// positive extreme).
struct Int4Weight {
  Tensor q;       // i4 [out, in]
  Tensor scales;  // f16 [out, groups]
};
Int4Weight int4_weight(Gen& g, int64_t out, int64_t in);

// Each row of x [n, k] as the int8 dot products of int8-weight and int4-weight Linears see it
// (backend/cpu/packed_linear.h: quantize_rows_to_quads), in groups of 128 elements (the last one
// shorter): q = x · (127 / max|group|) rounded to the nearest integer (ties to even), times
// max|group| / 127; a group of zeros stays zero.
Tensor quantize_rows_to_int8(const Tensor& x);

// Float tensor construction and reading, through tests/ops/f16_reference.h for narrow types.
Tensor make_tensor(DType dtype, const std::vector<float>& v, const Shape& shape);
double value_at(const Tensor& t, int64_t i);
// f rounded to `dtype` (identity for f32).
float round_value(DType dtype, float f);

// One execute() of a scenario: graph inputs by name (host tensors) and, for graphs with
// attention, the step layout. Cross K/V are referenced by index into Scenario::cross (each
// backend gets its own copy in its memory); layout.cross is filled per backend.
struct ScenarioStep {
  std::map<std::string, Tensor> feed;
  std::optional<StepLayout> layout;
  std::vector<int> cross;  // [seqs]: index into Scenario::cross, -1 for none
};

struct Scenario {
  Graph graph;
  std::vector<ScenarioStep> steps;
  std::optional<KvGeometry> kv;  // KV storage for cached attention, created per backend
  int64_t kv_blocks = 0;
  std::vector<CrossKv> cross;
};

// Outputs of every step, in graph output order, copied to host memory.
using ScenarioOutputs = std::vector<std::vector<Tensor>>;
ScenarioOutputs run_scenario(Backend& backend, const Scenario& scenario);
// Empty when the backend has a kernel for every node; otherwise the first reason why not.
std::string unsupported(const Backend& backend, const Graph& graph);

// How an output is compared with the reference.
enum class CheckKind : uint8_t {
  kExact,        // bit for bit (any NaN matches any NaN)
  kMaxRelative,  // |got - ref| <= tol * max |ref| over the whole output (the parity metric)
  kRowRelative,  // the same per row of the last dimension (rows of different scales)
  kElementwise,  // |got - ref| <= tol * |ref| + atol per element
};
struct Check {
  CheckKind kind = CheckKind::kMaxRelative;
  double tol = 0.0;   // 0: the dtype's tolerance
  double atol = 0.0;  // kElementwise only
};
// The tolerance relative to max |ref| for outputs of a dtype: f32 1e-5 (the parity target); f16
// 2^-9 and bf16 2^-6, two to four units in the last place of the largest element, room for a
// few roundings of intermediates.
double dtype_tolerance(DType dtype);
// Compares one output; the failure names `what` and the first offending element.
void expect_matches(const Tensor& got, const Tensor& ref, const Check& check,
                    const std::string& what);

// A row of the op table. `make` builds the scenario for a Gen (the case's dtype and seed).
struct OpCase {
  std::string name;  // [A-Za-z0-9_], unique
  DType dtype = DType::kF32;
  std::vector<Check> checks;  // per graph output; one entry applies to all
  std::function<Scenario(Gen&)> make;
};
// gtest prints a failing case by its name.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }
std::vector<OpCase> dense_op_cases();
std::vector<OpCase> attention_op_cases();

// "" for f32, "_f16" / "_bf16" otherwise: case names.
inline std::string dtype_suffix(DType dtype) {
  return dtype == DType::kF32 ? std::string() : "_" + std::string(dtype_name(dtype));
}

// A single-step scenario of graph `g` fed `feed` (no attention).
Scenario one_step(Graph g, std::map<std::string, Tensor> feed);

}  // namespace kiln::test
