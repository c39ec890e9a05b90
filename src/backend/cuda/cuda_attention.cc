// The Attention node on CUDA: checks what the host knows (the step's layout, the KV storage's
// geometry, each sequence's cross K/V), fills AttentionParams and launches attention.cu. T5's
// bucket of every distance is computed once at prepare() by the same function the CPU uses
// (graph/position_bias.h) and kept in device memory, so the GPU never re-derives a bucket
// boundary with its own log().
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_executor.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_storage.h"
#include "graph/position_bias.h"

namespace kiln::cuda {
namespace {

AttnKind attn_kind(AttentionKind k) {
  switch (k) {
    case AttentionKind::kEncoderSelf:
      return AttnKind::kEncoderSelf;
    case AttentionKind::kCachedSelf:
      return AttnKind::kCachedSelf;
    case AttentionKind::kCross:
      return AttnKind::kCross;
  }
  return AttnKind::kEncoderSelf;
}

AttnBias attn_bias(PositionBias b) {
  switch (b) {
    case PositionBias::kNone:
      return AttnBias::kNone;
    case PositionBias::kT5Relative:
      return AttnBias::kT5Relative;
    case PositionBias::kAlibi:
      return AttnBias::kAlibi;
  }
  return AttnBias::kNone;
}

class AttentionKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;

  void prepare(const Graph& graph) override {
    CudaKernel::prepare(graph);
    const AttentionAttrs& a = node_.attr<AttentionAttrs>();
    KILN_CHECK(a.head_dim >= 1 && a.head_dim <= kMaxHeadDim && a.num_heads >= 1,
               "node '{}': the cuda attention handles head_dim 1..{}, not {}", node_.name,
               kMaxHeadDim, a.head_dim);
    KILN_CHECK(a.kind != AttentionKind::kCross || (a.bias == PositionBias::kNone && !a.causal),
               "node '{}': cross attention takes no position bias and is not causal", node_.name);
    if (a.bias != PositionBias::kT5Relative) return;
    // Distances at or beyond max_distance all fall in the last bucket; one more entry covers
    // the boundary.
    bucket_len_ = std::max(a.max_distance, 1) + 2;
    std::vector<int> buckets(static_cast<size_t>(2 * bucket_len_));
    for (int n = 0; n < bucket_len_; ++n) {
      buckets[n] = t5_relative_bucket(n, a.bidirectional_buckets, a.num_buckets, a.max_distance);
      buckets[bucket_len_ + n] =
          t5_relative_bucket(-n, a.bidirectional_buckets, a.num_buckets, a.max_distance);
    }
    Tensor host = Tensor::from_vector(buckets, {static_cast<int64_t>(buckets.size())});
    buckets_ = ctx_.allocator().upload(host);
  }

  void run(const KernelArgs& args) override {
    const AttentionAttrs& a = node_.attr<AttentionAttrs>();
    KILN_CHECK(args.step != nullptr && args.step->layout != nullptr,
               "node '{}': attention needs the step's layout", node_.name);
    const StepLayout& layout = *args.step->layout;
    const int64_t width = static_cast<int64_t>(a.num_heads) * a.head_dim;
    const Tensor& q = args.in[0];
    const DType dtype = q.dtype();
    KILN_CHECK(q.device() == Device::kCuda, "node '{}': q is not in device memory", node_.name);
    KILN_CHECK(layout.total_tokens() == q.dim(0),
               "node '{}': step layout covers {} tokens, input has {}", node_.name,
               layout.total_tokens(), q.dim(0));
    AttentionParams p{};
    p.kind = attn_kind(a.kind);
    p.bias = attn_bias(a.bias);
    p.layer = a.layer;
    p.heads = a.num_heads;
    p.head_dim = a.head_dim;
    p.causal = a.causal;
    p.scale = a.scale;
    p.act = float_type(dtype);
    p.tokens = q.dim(0);
    p.q = q.raw();
    p.q_stride = width;
    p.kv_stride = width;
    const size_t elem = dtype_bytes(dtype, 1);
    size_t next = 1;
    if (a.packed_qkv) {
      p.k = static_cast<const char*>(q.raw()) + width * elem;
      p.v = static_cast<const char*>(q.raw()) + 2 * width * elem;
      p.q_stride = p.kv_stride = 3 * width;
    } else if (a.kind != AttentionKind::kCross) {
      const Tensor& k = args.in[1];
      const Tensor& v = args.in[2];
      KILN_CHECK(k.dtype() == dtype && v.dtype() == dtype && k.device() == Device::kCuda &&
                     v.device() == Device::kCuda,
                 "node '{}': q, k and v must be {} device tensors", node_.name, dtype_name(dtype));
      p.k = k.raw();
      p.v = v.raw();
      next = 3;
    }
    if (a.bias == PositionBias::kT5Relative) {
      const Tensor& table = args.in[next];
      KILN_CHECK(table.rank() == 2 && table.dim(0) == a.num_buckets && table.dim(1) == a.num_heads,
                 "node '{}': relative-bias table is {}, expected [{}, {}]", node_.name,
                 shape_str(table.shape()), a.num_buckets, a.num_heads);
      p.rel_table = table.raw();
      p.table_type = float_type(table.dtype());
      p.bucket_before = buckets_.data<int>() + bucket_len_;
      p.bucket_after = buckets_.data<int>();
      p.bucket_len = bucket_len_;
    }
    p.y = args.out[0].raw();
    switch (a.kind) {
      case AttentionKind::kEncoderSelf:
        break;
      case AttentionKind::kCachedSelf: {
        KILN_CHECK(args.step->kv != nullptr, "node '{}': cached attention without KV storage",
                   node_.name);
        auto* kv = dynamic_cast<CudaKvStorage*>(args.step->kv);
        KILN_CHECK(kv != nullptr, "node '{}': the KV storage is not in CUDA memory", node_.name);
        const KvGeometry& g = kv->geometry();
        // The cache holds the attention's own type, or E4M3 (--kv-cache fp8).
        KILN_CHECK(g.row_width == width && (g.dtype == dtype || g.dtype == DType::kF8E4M3) &&
                       a.layer >= 0 && a.layer < g.layers,
                   "node '{}': KV storage holds {} layers of {} rows {} wide, need layer {} of {} "
                   "(or f8_e4m3) rows {} wide",
                   node_.name, g.layers, dtype_name(g.dtype), g.row_width, a.layer,
                   dtype_name(dtype), width);
        p.kv = kv->device_view();
        break;
      }
      case AttentionKind::kCross:
        for (int s = 0; s < layout.num_seqs(); ++s) {
          const CrossKv* c = layout.cross[s];
          KILN_CHECK(c != nullptr && a.layer >= 0 && a.layer < static_cast<int>(c->keys.size()) &&
                         a.layer < static_cast<int>(c->values.size()),
                     "node '{}': sequence {} has no cross K/V for layer {}", node_.name, s,
                     a.layer);
          const Tensor& k = c->keys[a.layer];
          const Tensor& v = c->values[a.layer];
          KILN_CHECK(k.rank() == 2 && k.dim(1) == width && k.dim(0) > 0 && v.shape() == k.shape() &&
                         k.dtype() == dtype && v.dtype() == dtype && k.device() == Device::kCuda &&
                         v.device() == Device::kCuda,
                     "node '{}': cross K/V of sequence {} are {} {} and {} {} tensors, expected "
                     "[len, {}] {} device tensors each",
                     node_.name, s, dtype_name(k.dtype()), shape_str(k.shape()),
                     dtype_name(v.dtype()), shape_str(v.shape()), width, dtype_name(dtype));
        }
        break;
    }
    p.step = ctx_.uploads().step();
    p.status = ctx_.checks().status();
    p.node = node_index_;
    p.key_class = ctx_.uploads().step_key_class();
    p.split_out = ctx_.uploads().split_scratch();
    p.split_capacity = kSplitBlocks;
    p.tiled = ctx_.options().tiled_attention;
    p.tiled_rows = ctx_.options().tiled_rows;
    p.warp_rows = ctx_.options().warp_attention;
    p.layout_visible = ctx_.launch().layout_visible();
    p.sms = ctx_.device().multiprocessors;
    p.warps_forced = ctx_.options().attention_warps;
    p.key_bound = static_cast<int64_t>(ctx_.uploads().step_key_bucket()) * kKeyBucketSize;
    // The tiled kernel's grid has a block per tiled_rows rows of the longest sequence for each
    // sequence: a replayed graph keeps it, so that count is part of the graph's key
    // (CudaExecutor::GraphKey::row_tiles).
    p.longest_seq = ctx_.uploads().step_longest_rows();
    launch_attention(p, ctx_.kernel_stream());
  }

 private:
  Tensor buckets_;
  int bucket_len_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> make_attention_kernel(const Node& node, CudaContext& ctx) {
  return std::make_unique<AttentionKernel>(node, ctx);
}

}  // namespace kiln::cuda
