// Every op on every backend against the reference backend: the op table (this file's dense ops
// and test_backend_attention.cc's attention), run by one parametrized test. Beside it, the checks
// whose answers come from outside kiln: masked softmax scores, the reference's position-bias
// math against HuggingFace's values, and bad inputs rejected by every backend (cast rounding
// against the formats' definitions: test_backend_cast.cc).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "backend/reference/kernels.h"
#include "backend_ops.h"
#include "f16_reference.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

constexpr Activation kAllActivations[] = {Activation::kRelu, Activation::kGeluTanh,
                                          Activation::kGeluExact, Activation::kSilu};
constexpr DType kNarrowTypes[] = {DType::kF16, DType::kBF16};

const Check kExact{CheckKind::kExact};
const Check kMaxRelative{CheckKind::kMaxRelative};
const Check kRowRelative{CheckKind::kRowRelative};
// Activations per element: relative to the value, plus a small absolute term for the tails
// where 1 + tanh and 1 + erf cancel in f32 (as they do in PyTorch's f32 formulas).
const Check kActivationCheck{CheckKind::kElementwise, 1e-5, 1e-6};

Tensor ids_tensor(const std::vector<int64_t>& ids, DType type) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (type == DType::kI64) return Tensor::from_vector(ids, {n});
  return Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.end()), {n});
}

Graph fused(Graph g, int (*pass)(Graph&, const Logger&)) {
  const Logger quiet(LogLevel::kError);
  KILN_CHECK(pass(g, quiet) == 1 && g.nodes.size() == 1, "graph '{}': the pair did not fuse",
             g.name);
  return g;
}

// Rows of d values: ordinary, tiny (eps dominates the variance), large, and all zeros.
std::vector<float> norm_rows(Gen& g, int64_t d) {
  std::vector<float> x = g.floats(d, -2, 2);
  for (float v : g.floats(d, -1e-4f, 1e-4f)) x.push_back(v);
  for (float v : g.floats(d, -300, 300)) x.push_back(v);
  x.resize(x.size() + d, 0.0f);
  return x;
}

// Values over an activation's interesting range, and its special points.
std::vector<float> activation_inputs(Gen& g) {
  std::vector<float> x = g.floats(200, -6.0f, 6.0f);
  for (float special : {0.0f, -0.0f, 1e-6f, -1e-6f, 20.0f, -20.0f, 60.0f, -60.0f})
    x.push_back(special);
  return x;
}

void add_gather_cases(std::vector<OpCase>& cases) {
  struct Shape3 {
    int64_t vocab, d, n;
  };
  for (DType dtype : {DType::kF32, DType::kF16})
    for (DType ids_type : {DType::kI64, DType::kI32})
      for (Shape3 s : {Shape3{10, 6, 5}, Shape3{37, 33, 12}})
        cases.push_back({fmt::format("Embedding_ids_{}_vocab{}_d{}_n{}{}", dtype_name(ids_type),
                                     s.vocab, s.d, s.n, dtype_suffix(dtype)),
                         dtype,
                         {kExact},
                         [=](Gen& g) {
                           GraphBuilder b("embedding");
                           const int table = b.weight("table", g.random({s.vocab, s.d}));
                           const int ids = b.input("ids", ids_type, {kTokens});
                           b.output(b.embedding(table, ids, "embed"), "y");
                           std::uniform_int_distribution<int64_t> pick(0, s.vocab - 1);
                           std::vector<int64_t> v = {s.vocab - 1, 0};  // both ends
                           while (static_cast<int64_t>(v.size()) < s.n) v.push_back(pick(g.rng()));
                           return one_step(b.finish(), {{"ids", ids_tensor(v, ids_type)}});
                         }});
  struct GatherShape {
    int64_t n, d;
    std::vector<int64_t> rows;
  };
  for (const GatherShape& s :
       {GatherShape{6, 5, {5, 0, 5, 2}}, GatherShape{1, 7, {0}}, GatherShape{40, 192, {39, 3, 17}}})
    cases.push_back({fmt::format("GatherRows_n{}_d{}_rows{}", s.n, s.d, s.rows.size()),
                     DType::kF32,
                     {kExact},
                     [=](Gen& g) {
                       GraphBuilder b("gather");
                       const int x = b.input("x", g.dtype(), {kTokens, Dim::of(s.d)});
                       const int rows = b.input("rows", DType::kI64, {Dim::sym("rows")});
                       b.output(b.gather_rows(x, rows, "gather"), "y");
                       const int64_t r = static_cast<int64_t>(s.rows.size());
                       return one_step(b.finish(), {{"x", g.random({s.n, s.d})},
                                                    {"rows", Tensor::from_vector(s.rows, {r})}});
                     }});
}

void add_linear_cases(std::vector<OpCase>& cases) {
  struct LinearVariant {
    int64_t n, in, out;
    bool bias;
    std::optional<Activation> act;
    DType dtype;
  };
  std::vector<LinearVariant> variants;
  // Every bias and fused activation at an awkward shape: `out` is not a multiple of the CPU's
  // 16-row blocks nor of its 4-row groups, `in` not a multiple of the vector width.
  for (bool bias : {false, true}) {
    variants.push_back({7, 19, 37, bias, std::nullopt, DType::kF32});
    for (Activation act : kAllActivations) variants.push_back({7, 19, 37, bias, act, DType::kF32});
  }
  variants.push_back({1, 64, 16, true, std::nullopt, DType::kF32});             // one decode token
  variants.push_back({33, 200, 70, true, Activation::kGeluTanh, DType::kF32});  // long rows
  variants.push_back({4, 3, 5, false, std::nullopt, DType::kF32});  // shorter than a vector
  // Prefill: from 64 rows the CPU runs oneDNN's GEMM on slices of 64 output features.
  variants.push_back({64, 100, 150, true, Activation::kGeluTanh, DType::kF32});
  variants.push_back({130, 257, 70, false, Activation::kRelu, DType::kF32});
  for (DType narrow : kNarrowTypes) {
    variants.push_back({7, 19, 37, true, std::nullopt, narrow});
    variants.push_back({7, 19, 37, false, Activation::kGeluTanh, narrow});
  }
  // Rows of whole 16-byte vectors past the GEMV's rows: a GPU's bias + activation after the GEMM
  // takes its vector kernel.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    variants.push_back({33, 64, 96, true, Activation::kGeluTanh, dtype});
  // Row counts above a GPU's GEMM row bucket (CudaOptions::gemm_row_bucket, 64): cuBLASLt runs
  // the algorithm chosen for the bucket's top (192 rows here), checked for 130 rows.
  for (DType dtype : kNarrowTypes) variants.push_back({130, 64, 96, true, std::nullopt, dtype});
  // The skinny GEMM (9-32 rows): one and two row tiles, feature tiles of 8, 16 and 32 (on a
  // 132-SM GPU: the widest with a tile for every SM), rows of 33 k-steps (the warps' shares
  // unequal, a pass cut short), 16-warp blocks (more than 8 warps' one pass: 66 and 65 k-steps,
  // and 130 in two or three passes) at each tile width, and more tiles than the grid's blocks
  // (8461 features: blocks loop over tiles).
  for (DType dtype : kNarrowTypes) {
    variants.push_back({9, 1056, 37, false, std::nullopt, dtype});
    variants.push_back({16, 96, 70, true, Activation::kGeluTanh, dtype});
    variants.push_back({16, 64, 8461, true, std::nullopt, dtype});
    variants.push_back({20, 64, 8461, false, Activation::kRelu, dtype});
    variants.push_back({32, 256, 300, true, std::nullopt, dtype});
    variants.push_back({24, 2112, 45, true, Activation::kGeluTanh, dtype});
    variants.push_back({12, 4160, 130, false, std::nullopt, dtype});
    variants.push_back({16, 64, 3000, true, std::nullopt, dtype});
    variants.push_back({10, 2080, 3000, false, std::nullopt, dtype});
    variants.push_back({16, 2080, 4300, true, Activation::kGeluTanh, dtype});
    variants.push_back({20, 4160, 2200, false, std::nullopt, dtype});
  }
  for (const LinearVariant& v : variants)
    cases.push_back(
        {fmt::format("Linear_n{}_in{}_out{}_{}_{}{}", v.n, v.in, v.out, v.bias ? "bias" : "nobias",
                     v.act ? activation_name(*v.act) : "noact", dtype_suffix(v.dtype)),
         v.dtype,
         {kMaxRelative},
         [=](Gen& g) {
           GraphBuilder b("linear");
           const int x = b.input("x", g.dtype(), {kTokens, Dim::of(v.in)});
           const int w = b.weight("w", g.random({v.out, v.in}));
           const int bias = v.bias ? b.weight("b", g.random({v.out})) : -1;
           int y = b.linear(x, w, bias, "fc");
           if (v.act) y = b.activation(y, *v.act, "act");
           b.output(y, "y");
           Graph graph = b.finish();
           // Fused by the pass, as the pipeline does.
           if (v.act) graph = fused(std::move(graph), fuse_linear_activation);
           return one_step(std::move(graph), {{"x", g.random({v.n, v.in}, -2, 2)}});
         }});
}

void add_elementwise_cases(std::vector<OpCase>& cases) {
  enum class Binary { kAdd, kMul, kScale };
  struct Variant {
    Binary op;
    int64_t n, d;
    float factor;
    DType dtype;
  };
  std::vector<Variant> variants;
  for (Binary op : {Binary::kAdd, Binary::kMul, Binary::kScale}) {
    for (auto [n, d] :
         std::initializer_list<std::pair<int64_t, int64_t>>{{9, 31}, {1, 1}, {3, 1030}})
      variants.push_back({op, n, d, -0.3721f, DType::kF32});
    for (DType narrow : kNarrowTypes) variants.push_back({op, 9, 31, -0.3721f, narrow});
  }
  // T5's decoder output scale d_model^-0.5.
  variants.push_back(
      {Binary::kScale, 5, 192, static_cast<float>(1.0 / std::sqrt(192.0)), DType::kF32});
  for (const Variant& v : variants) {
    const char* name = v.op == Binary::kAdd ? "Add" : v.op == Binary::kMul ? "Mul" : "Scale";
    // Sums and products of two floats are exact in double, so f32 results must be the correctly
    // rounded ones, bit for bit.
    cases.push_back({fmt::format("{}_n{}_d{}{}", name, v.n, v.d, dtype_suffix(v.dtype)),
                     v.dtype,
                     {v.dtype == DType::kF32 ? kExact : kMaxRelative},
                     [=](Gen& g) {
                       GraphBuilder b("elementwise");
                       std::map<std::string, Tensor> feed;
                       feed["a"] = g.random({v.n, v.d}, -10, 10);
                       const int a = b.input("a", g.dtype(), {kTokens, Dim::of(v.d)});
                       if (v.op == Binary::kScale) {
                         b.output(b.scale(a, v.factor, "scale"), "y");
                         return one_step(b.finish(), std::move(feed));
                       }
                       feed["b"] = g.random({v.n, v.d}, -10, 10);
                       const int c = b.input("b", g.dtype(), {kTokens, Dim::of(v.d)});
                       b.output(v.op == Binary::kAdd ? b.add(a, c, "add") : b.mul(a, c, "mul"),
                                "y");
                       return one_step(b.finish(), std::move(feed));
                     }});
  }
}

void add_activation_cases(std::vector<OpCase>& cases) {
  for (Activation act : kAllActivations) {
    cases.push_back(
        {fmt::format("Activation_{}", activation_name(act)),
         DType::kF32,
         {kActivationCheck},
         [=](Gen& g) {
           const std::vector<float> x = activation_inputs(g);
           const int64_t n = static_cast<int64_t>(x.size());
           GraphBuilder b("activation");
           b.output(b.activation(b.input("x", g.dtype(), {kTokens, Dim::of(1)}), act, "act"), "y");
           return one_step(b.finish(), {{"x", g.tensor(x, {n, 1})}});
         }});
    cases.push_back(
        {fmt::format("GatedActivation_{}", activation_name(act)),
         DType::kF32,
         {kActivationCheck},
         [=](Gen& g) {
           const std::vector<float> x = activation_inputs(g);
           const int64_t n = static_cast<int64_t>(x.size());
           GraphBuilder b("gated");
           const int gate = b.input("gate", g.dtype(), {kTokens, Dim::of(1)});
           const int up = b.input("up", g.dtype(), {kTokens, Dim::of(1)});
           b.output(b.gated_activation(gate, up, act, "gated"), "y");
           return one_step(b.finish(), {{"gate", g.tensor(x, {n, 1})}, {"up", g.random({n, 1})}});
         }});
  }
  for (DType narrow : {DType::kF32, DType::kF16, DType::kBF16})
    cases.push_back({"GatedActivation_gelu_tanh_n16_d64" + dtype_suffix(narrow),
                     narrow,
                     {kMaxRelative},
                     [](Gen& g) {
                       GraphBuilder b("gated");
                       const int gate = b.input("gate", g.dtype(), {kTokens, Dim::of(64)});
                       const int up = b.input("up", g.dtype(), {kTokens, Dim::of(64)});
                       b.output(b.gated_activation(gate, up, Activation::kGeluTanh, "gated"), "y");
                       return one_step(b.finish(), {{"gate", g.random({16, 64}, -4, 4)},
                                                    {"up", g.random({16, 64})}});
                     }});
  // One packed input [n, 2f], each row gate | up (fuse_gate_up): a width the 16-byte kernels
  // take and one they do not.
  for (DType narrow : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t f : {64, 37})
      cases.push_back(
          {fmt::format("GatedActivation_packed_gelu_tanh_n16_d{}{}", f, dtype_suffix(narrow)),
           narrow,
           {kMaxRelative},
           [f](Gen& g) {
             GraphBuilder b("gated");
             const int x = b.input("x", g.dtype(), {kTokens, Dim::of(2 * f)});
             b.output(b.gated_activation(x, -1, Activation::kGeluTanh, "gated"), "y");
             return one_step(b.finish(), {{"x", g.random({16, 2 * f}, -4, 4)}});
           }});
}

// Rows: ordinary; shifted by 1000 (needs the max subtracted); a wide range; two masked scores.
std::vector<float> softmax_rows(Gen& g, int64_t d) {
  std::vector<float> x = g.floats(d, -3, 3);
  for (float v : g.floats(d, -3, 3)) x.push_back(1000.0f + v);
  for (float v : g.floats(d, -80, 80)) x.push_back(v);
  std::vector<float> masked = g.floats(d);
  masked[0] = masked[d / 2] = -std::numeric_limits<float>::infinity();
  x.insert(x.end(), masked.begin(), masked.end());
  return x;
}

Scenario softmax_scenario(Gen& g, const std::vector<float>& x, int64_t d) {
  GraphBuilder b("softmax");
  b.output(b.softmax(b.input("x", g.dtype(), {kTokens, Dim::of(d)}), "softmax"), "y");
  const int64_t n = static_cast<int64_t>(x.size()) / d;
  return one_step(b.finish(), {{"x", g.tensor(x, {n, d})}});
}

void add_softmax_cases(std::vector<OpCase>& cases) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    cases.push_back(
        {"Softmax_d17_special_rows" + dtype_suffix(dtype), dtype, {kRowRelative}, [](Gen& g) {
           return softmax_scenario(g, softmax_rows(g, 17), 17);
         }});
  cases.push_back({"Softmax_d1", DType::kF32, {kRowRelative}, [](Gen& g) {
                     return softmax_scenario(g, g.floats(3, -5, 5), 1);
                   }});
  cases.push_back({"Softmax_d300_n5", DType::kF32, {kRowRelative}, [](Gen& g) {
                     return softmax_scenario(g, g.floats(5 * 300, -10, 10), 300);
                   }});
}

void add_norm_cases(std::vector<OpCase>& cases) {
  struct NormVariant {
    int64_t d;
    double eps;
    DType dtype;
  };
  // d 1024 in fp16: a GPU's vector kernel with several warps per row.
  for (NormVariant v : {NormVariant{24, 1e-6, DType::kF32}, NormVariant{192, 1e-6, DType::kF32},
                        NormVariant{24, 1e-6, DType::kF16}, NormVariant{24, 1e-6, DType::kBF16},
                        NormVariant{1024, 1e-6, DType::kF16}}) {
    cases.push_back({fmt::format("RMSNorm_d{}{}", v.d, dtype_suffix(v.dtype)),
                     v.dtype,
                     {kRowRelative},
                     [=](Gen& g) {
                       const std::vector<float> x = norm_rows(g, v.d);
                       GraphBuilder b("rms");
                       const int xi = b.input("x", g.dtype(), {kTokens, Dim::of(v.d)});
                       const int w = b.weight("w", g.random({v.d}, 0.5f, 1.5f));
                       b.output(b.rms_norm(xi, w, v.eps, "norm"), "y");
                       return one_step(b.finish(), {{"x", g.tensor(x, {4, v.d})}});
                     }});
    // The fused residual add: the sum is exactly rounded, the norm reads the rounded sum.
    cases.push_back({fmt::format("AddRMSNorm_d{}{}", v.d, dtype_suffix(v.dtype)),
                     v.dtype,
                     {v.dtype == DType::kF32 ? kExact : kMaxRelative, kRowRelative},
                     [=](Gen& g) {
                       const std::vector<float> a = norm_rows(g, v.d);
                       GraphBuilder b("add_rms");
                       const int ai = b.input("a", g.dtype(), {kTokens, Dim::of(v.d)});
                       const int ci = b.input("b", g.dtype(), {kTokens, Dim::of(v.d)});
                       const int sum = b.add(ai, ci, "residual");
                       b.output(sum, "sum");
                       const int w = b.weight("w", g.random({v.d}, 0.5f, 1.5f));
                       b.output(b.rms_norm(sum, w, v.eps, "norm"), "normed");
                       // Both addends tiny in row 1 and zero in row 3, so their sum is too.
                       const std::vector<float> c = norm_rows(g, v.d);
                       return one_step(
                           fused(b.finish(), fuse_add_rms_norm),
                           {{"a", g.tensor(a, {4, v.d})}, {"b", g.tensor(c, {4, v.d})}});
                     }});
  }
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    cases.push_back({"LayerNorm_d33" + dtype_suffix(dtype), dtype, {kRowRelative}, [](Gen& g) {
                       const std::vector<float> x = norm_rows(g, 33);
                       GraphBuilder b("ln");
                       const int xi = b.input("x", g.dtype(), {kTokens, Dim::of(33)});
                       const int w = b.weight("w", g.random({33}, 0.5f, 1.5f));
                       b.output(b.layer_norm(xi, w, b.weight("b", g.random({33})), 1e-5, "ln"),
                                "y");
                       return one_step(b.finish(), {{"x", g.tensor(x, {4, 33})}});
                     }});
  // Rows of whole 16-byte vectors (a GPU's vector kernel), a BLOOM-like width.
  for (DType dtype : {DType::kF16, DType::kBF16})
    cases.push_back({"LayerNorm_d1024" + dtype_suffix(dtype), dtype, {kRowRelative}, [](Gen& g) {
                       const std::vector<float> x = norm_rows(g, 1024);
                       GraphBuilder b("ln");
                       const int xi = b.input("x", g.dtype(), {kTokens, Dim::of(1024)});
                       const int w = b.weight("w", g.random({1024}, 0.5f, 1.5f));
                       b.output(b.layer_norm(xi, w, b.weight("b", g.random({1024})), 1e-5, "ln"),
                                "y");
                       return one_step(b.finish(), {{"x", g.tensor(x, {4, 1024})}});
                     }});
  // A row with a large mean: torch.layer_norm (and the CPU kernel) subtract the mean rounded to
  // f32, which costs about ulp(1000) / std of accuracy; the reference keeps it in double.
  cases.push_back(
      {"LayerNorm_d256_large_mean", DType::kF32, {{CheckKind::kRowRelative, 1e-4}}, [](Gen& g) {
         std::vector<float> x = g.floats(256, -1, 1);
         for (float& v : x) v += 1000.0f;
         GraphBuilder b("ln");
         const int xi = b.input("x", g.dtype(), {kTokens, Dim::of(256)});
         const int w = b.weight("w", g.random({256}, 0.5f, 1.5f));
         b.output(b.layer_norm(xi, w, b.weight("b", g.random({256})), 1e-5, "ln"), "y");
         return one_step(b.finish(), {{"x", g.tensor(x, {1, 256})}});
       }});
}

// f32 values whose f16 / bf16 rounding is interesting: ties, overflow, subnormals.
std::vector<float> cast_inputs(Gen& g) {
  std::vector<float> x = {1.0f,
                          1.0f + 0x1p-11f,
                          1.0f + 3 * 0x1p-11f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          0x1p-14f,
                          0x1p-24f,
                          0x1p-25f,
                          3 * 0x1p-25f,
                          0x1.018p0f,
                          0x1.01p0f,
                          -0.0f,
                          1e30f,
                          -3e38f,
                          std::numeric_limits<float>::infinity()};
  for (float v : g.floats(64, -70000.0f, 70000.0f)) x.push_back(v);
  for (float v : g.floats(64, -1e-4f, 1e-4f)) x.push_back(v);
  for (float v : g.floats(16, -3e38f, 3e38f)) x.push_back(v);
  // 163 values: CUDA's cast runs eight a thread, then the 3 left one a thread.
  for (float v : g.floats(3, -2.0f, 2.0f)) x.push_back(v);
  return x;
}

void add_cast_cases(std::vector<OpCase>& cases) {
  // f32 -> narrow -> f32, and narrow -> other narrow (through f32 on the CPU).
  for (DType narrow : kNarrowTypes)
    cases.push_back(
        {fmt::format("Cast_f32_{}_f32", dtype_name(narrow)), DType::kF32, {kExact}, [=](Gen& g) {
           const std::vector<float> x = cast_inputs(g);
           GraphBuilder b("cast");
           const int h = b.cast(b.input("x", DType::kF32, {kTokens}), narrow, "narrow");
           b.output(h, "narrow");
           b.output(b.cast(h, DType::kF32, "back"), "back");
           const int64_t n = static_cast<int64_t>(x.size());
           return one_step(b.finish(), {{"x", g.tensor(x, {n})}});
         }});
  cases.push_back({"Cast_f32_f16_bf16", DType::kF32, {kExact}, [](Gen& g) {
                     const std::vector<float> x = cast_inputs(g);
                     GraphBuilder b("cast");
                     const int h = b.cast(b.input("x", DType::kF32, {kTokens}), DType::kF16, "f16");
                     b.output(b.cast(h, DType::kBF16, "bf16"), "bf16");
                     const int64_t n = static_cast<int64_t>(x.size());
                     return one_step(b.finish(), {{"x", g.tensor(x, {n})}});
                   }});
  // A narrow weight read in f32 (what GraphBuilder::weight_f32 makes when folding is off).
  for (DType narrow : kNarrowTypes)
    cases.push_back(
        {fmt::format("Cast_{}_weight_to_f32", dtype_name(narrow)),
         DType::kF32,
         {kExact},
         [=](Gen& g) {
           GraphBuilder b("cast_weight");
           const int w = b.weight("w", make_tensor(narrow, g.floats(40, -4, 4), {8, 5}));
           b.output(b.cast(w, DType::kF32, "w.f32"), "y");
           return one_step(b.finish(), {});
         }});
}

}  // namespace

std::vector<OpCase> dense_op_cases() {
  std::vector<OpCase> cases;
  add_gather_cases(cases);
  add_linear_cases(cases);
  add_elementwise_cases(cases);
  add_activation_cases(cases);
  add_softmax_cases(cases);
  add_norm_cases(cases);
  add_cast_cases(cases);
  return cases;
}

namespace {

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases = dense_op_cases();
  for (OpCase& c : attention_op_cases()) cases.push_back(std::move(c));
  return cases;
}

// Outputs widened to f32 (a narrow run's outputs against its f32 twin's).
ScenarioOutputs widened(const ScenarioOutputs& outputs) {
  ScenarioOutputs out;
  for (const std::vector<Tensor>& step : outputs) {
    std::vector<Tensor> wide;
    for (const Tensor& t : step) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<float>(value_at(t, i));
      wide.push_back(Tensor::from_vector(v, t.shape()));
    }
    out.push_back(std::move(wide));
  }
  return out;
}

void expect_all_match(const ScenarioOutputs& got, const ScenarioOutputs& ref,
                      const std::vector<Check>& checks, const std::string& who) {
  ASSERT_EQ(got.size(), ref.size()) << who;
  for (size_t s = 0; s < ref.size(); ++s) {
    ASSERT_EQ(got[s].size(), ref[s].size()) << who;
    for (size_t o = 0; o < ref[s].size(); ++o)
      expect_matches(got[s][o], ref[s][o], checks[std::min(o, checks.size() - 1)],
                     fmt::format("{}, step {}, output {}", who, s, o));
  }
}

constexpr uint32_t kSeed = 20240611;

class OpTable : public testing::TestWithParam<OpCase> {};

TEST_P(OpTable, MatchesReference) {
  const OpCase& c = GetParam();
  Gen gen(c.dtype, c.dtype, kSeed);
  const Scenario scenario = c.make(gen);
  const std::unique_ptr<Backend> reference = reference_backend();
  ASSERT_EQ(unsupported(*reference, scenario.graph), "");
  const ScenarioOutputs ref = run_scenario(*reference, scenario);
  // Every backend with kernels for the case runs it (narrow activations are CUDA's, plus the CPU's
  // narrow gathers and casts); the others say why not.
  int compared = 0;
  std::string refusals;
  for (NamedBackend& b : available_backends()) {
    const std::string why = unsupported(*b.backend, scenario.graph);
    if (!why.empty()) {
      refusals += fmt::format("\n  {}: {}", b.name, why);
      continue;
    }
    expect_all_match(run_scenario(*b.backend, scenario), ref, c.checks, b.name);
    ++compared;
  }
  if (c.dtype != DType::kF32) {
    // The reference's narrow path against its f32 path on the same numbers: they differ only
    // by the rounding of outputs (and of intermediates a graph stores).
    Gen wide(DType::kF32, c.dtype, kSeed);
    std::vector<Check> checks = c.checks;
    for (Check& check : checks) {
      if (check.kind == CheckKind::kExact) check.kind = CheckKind::kMaxRelative;
      check.tol = std::max(check.tol, dtype_tolerance(c.dtype));
    }
    expect_all_match(widened(ref), run_scenario(*reference, c.make(wide)), checks,
                     fmt::format("reference in {} against reference in f32", dtype_name(c.dtype)));
  }
  if (compared > 0) return;
  // A case no backend ran tested the reference alone. Narrow activations that only CUDA computes
  // are skipped, saying so, on a machine without a GPU (where the CUDA tests skip too); anything
  // else is a failure: an f32 case every machine must run, or a case the GPU here refuses.
  if (c.dtype != DType::kF32 && query_cuda().device_count == 0)
    GTEST_SKIP()
        << c.name << ": no backend here has kernels for it (the reference's " << dtype_name(c.dtype)
        << " path was checked against its f32 path); it runs on CUDA, and this machine has "
        << "no GPU (" << query_cuda().error << ")" << refusals;
  ADD_FAILURE() << "no backend besides the reference ran " << c.name << refusals;
}

INSTANTIATE_TEST_SUITE_P(BackendOps, OpTable, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<OpCase>& info) {
                           return info.param.name;
                         });

// Masked (-inf) scores get probability exactly 0, shifted rows stay finite, rows sum to 1.
TEST(BackendOps, SoftmaxMasksInfiniteScores) {
  Gen g(DType::kF32, DType::kF32, kSeed);
  const int64_t d = 17;
  const Scenario s = softmax_scenario(g, softmax_rows(g, d), d);
  for (NamedBackend& backend : every_backend()) {
    const Tensor y = run_scenario(*backend.backend, s)[0][0];
    for (int64_t r = 0; r < y.dim(0); ++r) {
      double sum = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        const float p = y.data<float>()[r * d + i];
        EXPECT_TRUE(std::isfinite(p) && p >= 0.0f) << backend.name << " row " << r << " " << p;
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5) << backend.name << " row " << r;
    }
    EXPECT_EQ(y.data<float>()[3 * d], 0.0f) << backend.name;
    EXPECT_EQ(y.data<float>()[3 * d + d / 2], 0.0f) << backend.name;
  }
}

// The reference's position-bias math against HuggingFace's values (the tables of
// tests/unit/test_position_bias.cc, computed from T5Attention._relative_position_bucket and
// build_alibi_tensor).
TEST(BackendOps, ReferencePositionBiasMatchesHuggingFace) {
  const std::pair<int64_t, int> bidirectional[] = {
      {-1000, 15}, {-128, 15}, {-100, 15}, {-40, 12}, {-20, 10}, {-9, 8},  {-8, 8},  {-7, 7},
      {-1, 1},     {0, 0},     {1, 17},    {7, 23},   {8, 24},   {20, 26}, {40, 28}, {1000, 31}};
  for (auto [rel, want] : bidirectional)
    EXPECT_EQ(reference::t5_bucket(rel, true, 32, 128), want) << rel;
  const std::pair<int64_t, int> causal[] = {{-1000, 31}, {-127, 31}, {-100, 30}, {-64, 26},
                                            {-40, 23},   {-20, 17},  {-9, 9},    {-8, 8},
                                            {-1, 1},     {0, 0},     {1, 0},     {100, 0}};
  for (auto [rel, want] : causal) EXPECT_EQ(reference::t5_bucket(rel, false, 32, 128), want) << rel;
  EXPECT_EQ(reference::t5_bucket(-20, true, 8, 20), 3);
  EXPECT_EQ(reference::t5_bucket(2, true, 8, 20), 6);
  // 6 heads: the 4-head series (base 1/4), then odd powers of the 8-head base (1/2).
  EXPECT_EQ(reference::alibi_slopes(6),
            (std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}));
  const std::vector<double> s8 = reference::alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(s8[h], std::ldexp(1.0, -(h + 1))) << h;
  const std::vector<double> s12 = reference::alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  EXPECT_NEAR(s12[8], std::pow(2.0, -0.5), 1e-15);
  EXPECT_NEAR(s12[11], std::pow(2.0, -3.5), 1e-15);
}

// Greedy decoding on a device: the row argmax where the logits live is the first index of each
// row's largest value (ties, a maximum in the last column, a row of equal values).
TEST(BackendOps, ArgmaxRowsOnTheDeviceTakesTheFirstMaximum) {
  const int64_t rows = 5, cols = 3001;
  Gen g(DType::kF32, DType::kF32, 5);
  std::vector<float> v = g.floats(rows * cols, -5, 5);
  v[1 * cols + 10] = v[1 * cols + 500] = 9.0f;  // a tie: 10 wins
  std::fill(v.begin() + 2 * cols, v.begin() + 3 * cols, 0.25f);
  v[4 * cols - 1] = 7.0f;
  std::vector<int64_t> expected(rows, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 1; c < cols; ++c)
      if (v[r * cols + c] > v[r * cols + expected[r]]) expected[r] = c;
  ASSERT_EQ(expected[1], 10);
  ASSERT_EQ(expected[3], cols - 1);
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    const Tensor logits = nb.backend->allocator().upload(Tensor::from_vector(v, {rows, cols}));
    std::vector<int64_t> got(rows, -1);
    if (!nb.backend->token_selector().argmax_rows(logits, got))
      continue;  // host backends read logits directly
    EXPECT_EQ(got, expected) << nb.name;
    // Banned ids (EOS before min_new_tokens) are skipped in flagged rows only: row 1's tie
    // moves to column 500, row 3 to its best column but the last; rows 0, 2, 4 are unflagged.
    const std::vector<int64_t> banned = {10, cols - 1, 0};
    const std::vector<uint8_t> flagged = {0, 1, 0, 1, 0};
    std::vector<int64_t> banned_expected = expected;
    banned_expected[1] = 500;
    banned_expected[3] = 1;
    for (int64_t c = 2; c < cols - 1; ++c)
      if (c != 10 && v[3 * cols + c] > v[3 * cols + banned_expected[3]]) banned_expected[3] = c;
    ASSERT_TRUE(nb.backend->token_selector().argmax_rows(logits, got, banned, flagged)) << nb.name;
    EXPECT_EQ(got, banned_expected) << nb.name;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no backend here computes argmax on a device (CUDA does)";
}

// Every backend's allocator copies groups of tensors (a request's cross K/V) into one buffer per
// group: same dtypes, shapes and bytes, parts of any size (odd byte counts, 16-byte multiples,
// empty), slices of a larger tensor as sources, and the copies outlive the sources.
TEST(BackendOps, AllocatorCopyGroupsCopiesEveryPart) {
  Gen g(DType::kF32, DType::kF32, 9);
  const Tensor big = Tensor::from_vector(g.floats(40 * 12, -3, 3), {40, 12});
  const std::vector<uint8_t> odd = {1, 2, 3, 4, 5, 6, 7};
  Tensor bytes = Tensor::empty(DType::kI8, {7});
  std::memcpy(bytes.raw(), odd.data(), odd.size());
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    Allocator& alloc = nb.backend->allocator();
    std::vector<std::vector<Tensor>> out;
    {
      const Tensor src = alloc.upload(big);
      const std::vector<std::vector<Tensor>> groups = {
          {src.slice_rows(3, 9), alloc.upload(bytes), src.slice_rows(0, 0)},
          {src.slice_rows(9, 40)},
          {}};
      out = alloc.copy_groups(groups);
    }
    ASSERT_EQ(out.size(), 3u) << nb.name;
    ASSERT_EQ(out[0].size(), 3u) << nb.name;
    ASSERT_EQ(out[1].size(), 1u) << nb.name;
    EXPECT_TRUE(out[2].empty()) << nb.name;
    const Tensor a = alloc.to_host(out[0][0]), b = alloc.to_host(out[0][1]),
                 c = alloc.to_host(out[1][0]);
    EXPECT_EQ(a.shape(), (Shape{6, 12})) << nb.name;
    EXPECT_EQ(out[0][2].shape(), (Shape{0, 12})) << nb.name;
    EXPECT_EQ(std::memcmp(a.raw(), big.data<float>() + 3 * 12, 6 * 12 * sizeof(float)), 0)
        << nb.name;
    EXPECT_EQ(std::memcmp(b.raw(), odd.data(), odd.size()), 0) << nb.name;
    EXPECT_EQ(std::memcmp(c.raw(), big.data<float>() + 9 * 12, 31 * 12 * sizeof(float)), 0)
        << nb.name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// copy_row_groups (the encoder's cross K/V of a batch): group g gets rows [bounds[g], bounds[g +
// 1]) of every source, whatever the sources' dtypes and row sizes (odd byte counts), with empty
// groups; the copies outlive the sources. Bounds outside the sources are refused.
TEST(BackendOps, AllocatorCopyRowGroupsCopiesEveryRange) {
  Gen g(DType::kF32, DType::kF32, 11);
  const Tensor a = Tensor::from_vector(g.floats(40 * 12, -3, 3), {40, 12});
  Tensor b = Tensor::empty(DType::kI8, {40, 3});
  for (int64_t i = 0; i < 120; ++i) b.data<int8_t>()[i] = static_cast<int8_t>(i * 7 - 100);
  const std::vector<int64_t> bounds = {0, 3, 3, 17, 40};
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    Allocator& alloc = nb.backend->allocator();
    std::vector<std::vector<Tensor>> out;
    {
      const std::vector<Tensor> sources = {alloc.upload(a), alloc.upload(b)};
      out = alloc.copy_row_groups(sources, bounds);
      EXPECT_THROW(alloc.copy_row_groups(sources, std::vector<int64_t>{0, 41}), Error) << nb.name;
      EXPECT_THROW(alloc.copy_row_groups(sources, std::vector<int64_t>{5, 2}), Error) << nb.name;
    }
    ASSERT_EQ(out.size(), 4u) << nb.name;
    for (size_t grp = 0; grp < out.size(); ++grp) {
      ASSERT_EQ(out[grp].size(), 2u) << nb.name;
      const int64_t begin = bounds[grp], rows = bounds[grp + 1] - begin;
      EXPECT_EQ(out[grp][0].shape(), (Shape{rows, 12})) << nb.name;
      EXPECT_EQ(out[grp][1].shape(), (Shape{rows, 3})) << nb.name;
      if (rows == 0) continue;
      const Tensor ha = alloc.to_host(out[grp][0]), hb = alloc.to_host(out[grp][1]);
      EXPECT_EQ(std::memcmp(ha.raw(), a.data<float>() + begin * 12, rows * 12 * sizeof(float)), 0)
          << nb.name << " group " << grp;
      EXPECT_EQ(std::memcmp(hb.raw(), b.data<int8_t>() + begin * 3, rows * 3), 0)
          << nb.name << " group " << grp;
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(BackendOps, BadInputEmbeddingIdOutOfRange) {
  const int64_t vocab = 10;
  for (DType id_type : {DType::kI64, DType::kI32}) {
    GraphBuilder b("embedding");
    const int t = b.weight("table", Tensor::zeros(DType::kF32, {vocab, 4}));
    b.output(b.embedding(t, b.input("ids", id_type, {kTokens}), "embed"), "y");
    const Graph g = b.finish();
    for (int64_t bad : {vocab, int64_t{-1}, int64_t{1000000}}) {
      const Scenario s = one_step(g, {{"ids", ids_tensor({0, bad}, id_type)}});
      for (NamedBackend& backend : every_backend())
        EXPECT_THROW(run_scenario(*backend.backend, s), Error) << backend.name << " id " << bad;
    }
  }
}

TEST(BackendOps, BadInputGatherRowOutOfRange) {
  GraphBuilder b("gather");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(5)});
  b.output(b.gather_rows(x, b.input("rows", DType::kI64, {Dim::sym("rows")}), "gather"), "y");
  const Graph g = b.finish();
  for (int64_t bad : {6, -1}) {
    const Scenario s =
        one_step(g, {{"x", Tensor::zeros(DType::kF32, {6, 5})},
                     {"rows", Tensor::from_vector(std::vector<int64_t>{0, bad}, {2})}});
    for (NamedBackend& backend : every_backend())
      EXPECT_THROW(run_scenario(*backend.backend, s), Error) << backend.name << " row " << bad;
  }
}

}  // namespace
}  // namespace kiln::test
