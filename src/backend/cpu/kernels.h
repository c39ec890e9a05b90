// CPU kernels, fp32, one function per op. Each reads its inputs in the order the op registry
// documents and writes preallocated outputs of the inferred shapes. Every kernel computes each
// output row from its own input row(s) in a fixed order, so a sequence's results do not depend
// on what else is in the batch.
#pragma once

#include <span>

#include "backend/kernel.h"
#include "core/thread_pool.h"
#include "graph/ir.h"

namespace kiln::cpu {

struct KernelEnv {
  ThreadPool& pool;
  const StepContext* step;     // attention only
  bool packed_weight = false;  // the node's weight is panel16-packed (Embedding tables)
};

void embedding(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
// The AVX-512 Linear over panel16-packed weights (kernels_packed.cc), for f32, bf16, f16 and i8
// weights; weights a plan stores plain are packed when the kernel is prepared.
KernelFactory packed_linear_factory(DType weight);
// The same Linear for bf16 weights with AVX512-BF16 dot products: activations rounded to bf16
// once per row, products summed in f32 (vdpbf16ps), twice the f32 FMA rate.
KernelFactory packed_bf16_dot_linear_factory();
// The same Linear for i8 weights with AVX512-VNNI dot products (kernels_vnni.cc): activations
// quantized to int8 once per row (a scale per group of 128), integer sums (vpdpbusd), then the
// groups' and the weight's scales.
KernelFactory packed_int8_dot_linear_factory();
// W8A8 Linears (an input scale: graph/linear.h), i8 weights × int8 inputs with a static scale:
// AVX512-VNNI dot products over whole rows (kernels_vnni.cc), and for the AVX-512 family without
// them, the int8 input levels as f32 through the packed f32 FMAs (kernels_w8a8.cc).
KernelFactory packed_w8a8_vnni_linear_factory();
KernelFactory packed_w8a8_fma_linear_factory();
// int4-weight Linears (kernels_int4.cc): i4 weights in panel16q4 with f16 group scales,
// activations quantized to int8 in groups of 128, integer dot products — vpdpbusd (`vnni`) or
// vpmaddubsw + vpmaddwd (AVX512-BW), the same integers.
KernelFactory packed_int4_linear_factory(bool vnni);
void linear_avx2(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
// Weights narrower than the activations (kernels_lowp.cc): f32 in, f32 out, f32 accumulation.
void linear_bf16_avx2(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void linear_f16_avx2(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void linear_i8_avx2(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
// The same for i8 weights below the prefill's row count, in AVX2 integer dot products
// (kernels_lowp_int8.cc): each activation row quantized to int16 once, exact integer sums.
void linear_i8_dot_avx2(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
// W8A8 in the same AVX2 integer dot products, every row quantized with the static input scale
// (int16 lanes holding int8 levels: vpmaddwd's pair sums cannot saturate).
void linear_w8a8_avx2(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
// int4-weight in AVX2 integer dot products over plain i4 weights (kernels_int4_avx2.cc), the
// AVX-512 family's numbers up to f32 summation order.
void linear_i4_avx2(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void embedding_narrow(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void gather_rows(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void add(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void mul(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void scale(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void activation(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void gated_activation(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
// The same on sixteen lanes (AVX-512 family; bit for bit the same results).
void gated_activation_avx512(const Node&, std::span<const Tensor>, std::span<Tensor>,
                             const KernelEnv&);
void softmax(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void cast(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void rms_norm(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void layer_norm(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void add_rms_norm(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
void attention(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
// The same with AVX-512 inner loops (attention_avx512.cc).
void attention_avx512(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);
// out[r] = the first index of the largest value of row r of logits [rows, vocab] (f32), never
// one of `banned` where banned_rows[r] is non-zero (TokenSelector::argmax_rows).
void argmax_rows(const Tensor& logits, std::span<int64_t> out, std::span<const int64_t> banned,
                 std::span<const uint8_t> banned_rows, ThreadPool& pool);

// The store of an AVX2 Linear tile (kernels_lowp.cc, kernels_lowp_int8.cc): rows t .. t+tn-1
// and outputs o .. o+live-1 of y [n, m] get value(j, f) × scales[o + f] (when given) + bias[o + f]
// (when given), in that order.
template <typename Value>
inline void store_linear_tile(float* y, int64_t m, int64_t t, int tn, int64_t o, int64_t live,
                              const float* scales, const float* bias, Value value) {
  for (int j = 0; j < tn; ++j) {
    float* yr = y + (t + j) * m;
    for (int64_t f = 0; f < live; ++f) {
      float v = value(j, f);
      if (scales) v *= scales[o + f];
      if (bias) v += bias[o + f];
      yr[o + f] = v;
    }
  }
}

// Registers every CPU kernel (the single dispatch point of the CPU backend).
void register_kernels(KernelRegistry& registry);

}  // namespace kiln::cpu
