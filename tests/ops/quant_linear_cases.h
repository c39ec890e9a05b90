// The quantized Linear cases the CUDA op tests share (test_backend_int8_narrow.cc: int8-weight
// and int4-weight; test_backend_w8a8_cuda.cc: W8A8): an int8 weight over the whole range, the
// variants of what is fused into the Linear, the one-node graph of each, and the comparison of
// every CUDA backend that runs it against the reference backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "graph/ir.h"

namespace kiln::test {

// q [rows, cols] over the whole int8 range (both ends included) and positive per-row scales.
struct Int8Weight {
  Tensor q, scales;
};
Int8Weight int8_weight(Gen& g, int64_t rows, int64_t cols);

enum class Variant : uint8_t {
  kPlain,
  kBiasAct,
  kF32Bias,
  kResidual,
  kWidened,
  kGatheredWidened,
  kLayerNorm,        // a LayerNorm folded into the Linear (with a bias): gamma as its norm scale
  kRmsNorm,          // an RMSNorm folded (no bias)
  kLayerNormNoBias,  // a LayerNorm folded into a Linear without a bias (the fold makes one)
};
inline constexpr Variant kVariants[] = {
    Variant::kPlain,     Variant::kBiasAct, Variant::kF32Bias,
    Variant::kResidual,  Variant::kWidened, Variant::kGatheredWidened,
    Variant::kLayerNorm, Variant::kRmsNorm, Variant::kLayerNormNoBias};
bool folds_norm(Variant v);
// The variants whose Linear stores f32 (a widened output; an f32 Linear has none).
bool widens(Variant v);
// A Linear's [out, in] weight shape, as the cases list them.
struct LinearShape {
  int64_t in, out;
};
const char* variant_name(Variant v);

// The Linear (with the nodes its variant fuses into it, fused as the CUDA pipeline fuses them;
// `fuse` false: the graph before fusing). `int4`: int4 weights with f16 group scales.
// `input_scale` >= 0: a W8A8 Linear, x read as int8 with that static scale (no norm variants);
// with `fp8`, an fp8 plan's Linear instead (E4M3 weights with per-channel scales, x read as E4M3).
Graph int8_linear_graph(Gen& g, DType dtype, int64_t in, int64_t out, Variant variant,
                        bool fuse = true, bool int4 = false, float input_scale = -1.0f,
                        bool fp8 = false);

// Runs `graph` (one fused quantized Linear of `variant`, [n, in] x [out, in]^T) on every CUDA
// backend that takes it and on the reference, comparing with `check`, each failure labelled with
// the backend's name and `what`; returns how many backends compared (the reference runs only
// where one does: it is slow at these sizes). The feed: x in [-2, 2), a residual likewise, and
// for gathered rows n rows of a table of n + 5, in another order, one row twice. (The CPU's
// f32-input int8 Linears quantize their inputs: test_backend_lowp.cc.)
int compare_on_cuda(Backend& reference, std::vector<NamedBackend>& backends, Gen& g,
                    const Graph& graph, int64_t n, int64_t in, int64_t out, Variant variant,
                    const Check& check, const std::string& what);

// "f16 plain [n, in] x [out, in]^T"
std::string case_name(DType dtype, Variant variant, int64_t n, int64_t in, int64_t out);

}  // namespace kiln::test
