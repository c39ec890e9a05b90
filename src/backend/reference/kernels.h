// The reference kernels and the number formats they read and write. Every kernel decodes its
// inputs to double, computes in double and rounds each output once, to nearest even, into the
// output's dtype (f32, f16 or bf16). Kernels are plain loops over one element or row at a time:
// slow, obvious and independent of the fast kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/kernel.h"

namespace kiln::reference {

// The narrow float formats from their definitions (IEEE binary16; bfloat16 = the upper half of
// binary32; OCP's E4M3 and E5M2), not through core/half.h or core/fp8.h. Encoding rounds to
// nearest, ties to even; values beyond the largest finite number round to infinity, except in
// E4M3, which has none and saturates at ±448; NaN stays NaN.
double f16_to_double(uint16_t bits);
uint16_t f16_from_double(double x);
double bf16_to_double(uint16_t bits);
uint16_t bf16_from_double(double x);
double f8_e4m3_to_double(uint8_t bits);
uint8_t f8_e4m3_from_double(double x);
double f8_e5m2_to_double(uint8_t bits);
uint8_t f8_e5m2_from_double(double x);

// Element i of a float tensor (f32, f16 or bf16), of an index tensor (i32, i64), or of a
// quantized weight (i8, i4: the integer).
double element(const void* data, DType dtype, int64_t i);
int64_t index_element(const Tensor& t, int64_t i);
// Writes x rounded to `dtype` as element i.
void set_element(void* data, DType dtype, int64_t i, double x);
// x as `dtype` would hold it, back in double.
double round_to(DType dtype, double x);
// A float tensor's elements in double.
std::vector<double> load(const Tensor& t);

// HuggingFace's activation functions (gelu_tanh = NewGELUActivation, "gelu_new"), in double.
double activation(Activation act, double x);

// T5's _relative_position_bucket for relative_position = key_pos - query_pos, step by step in
// float32 as the PyTorch code computes it (a bucket is a discrete choice: the rounding matters).
int t5_bucket(int64_t relative_position, bool bidirectional, int num_buckets, int max_distance);
// BLOOM's ALiBi slope of each head: 2^(-8 (h+1) / p) for the first p = 2^floor(log2 H) heads,
// then 2^(-4 (2i+1) / p) for the remaining ones (build_alibi_tensor's interleave).
std::vector<double> alibi_slopes(int num_heads);

void embedding(const Node& node, const KernelArgs& args);
void linear(const Node& node, const KernelArgs& args);
void add(const Node& node, const KernelArgs& args);
void mul(const Node& node, const KernelArgs& args);
void scale(const Node& node, const KernelArgs& args);
void rms_norm(const Node& node, const KernelArgs& args);
void layer_norm(const Node& node, const KernelArgs& args);
void activation(const Node& node, const KernelArgs& args);
void gated_activation(const Node& node, const KernelArgs& args);
void softmax(const Node& node, const KernelArgs& args);
void cast(const Node& node, const KernelArgs& args);
void attention(const Node& node, const KernelArgs& args);
void gather_rows(const Node& node, const KernelArgs& args);
void add_rms_norm(const Node& node, const KernelArgs& args);

// Every reference kernel, for activations and weights in f32, f16 and bf16.
void register_kernels(KernelRegistry& registry);

}  // namespace kiln::reference
