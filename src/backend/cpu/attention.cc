// Attention over ragged sequences: encoder self attention (keys = the sequence's own tokens),
// cached self attention (append this step's K/V to the paged cache, attend to all of it) and
// cross attention (keys = the request's cross K/V). Scores, position bias and softmax in fp32.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/kernels.h"
#include "graph/position_bias.h"

namespace kiln::cpu {
namespace {

struct Rows {  // a strided view of per-position rows [len, H*dh] for one head
  virtual ~Rows() = default;
  virtual const float* row(int64_t pos) const = 0;
};

struct DenseRows final : Rows {
  const float* base;
  int64_t stride;
  const float* row(int64_t pos) const override { return base + pos * stride; }
};

struct PagedRows final : Rows {
  KvStorage* cache;
  int layer;
  bool keys;
  std::span<const int32_t> blocks;
  int block_size;
  int64_t width;
  const float* row(int64_t pos) const override {
    const int32_t b = blocks[pos / block_size];
    const float* blk =
        static_cast<const float*>(keys ? cache->key_block(layer, b) : cache->value_block(layer, b));
    return blk + (pos % block_size) * width;
  }
};

// Copies sequence s's K/V rows of this step into its cache blocks for `layer`.
void append_to_cache(const StepLayout& L, int s, KvStorage* cache, int layer, const float* k,
                     const float* v, int64_t k_stride, int64_t width) {
  const int bs = cache->geometry().block_size;
  const std::span<const int32_t> blocks = L.blocks(s);
  for (int64_t i = 0; i < L.num_tokens(s); ++i) {
    const int64_t pos = L.past_len[s] + i;
    const int32_t b = blocks[pos / bs];
    const int64_t off = (pos % bs) * width;
    const int64_t row = L.token_begin[s] + i;
    std::memcpy(static_cast<float*>(cache->key_block(layer, b)) + off, k + row * k_stride,
                width * sizeof(float));
    std::memcpy(static_cast<float*>(cache->value_block(layer, b)) + off, v + row * k_stride,
                width * sizeof(float));
  }
}

}  // namespace

// q [n, H*dh] (or packed qkv [n, 3*H*dh] as [3, H, dh]), k, v [n, H*dh], rel table [buckets, H]
// -> [n, H*dh]
void attention(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
               const KernelEnv& env) {
  const AttentionAttrs& a = node.attr<AttentionAttrs>();
  KILN_CHECK(env.step != nullptr && env.step->layout != nullptr,
             "node '{}': attention needs the step's layout", node.name);
  const StepLayout& L = *env.step->layout;
  KvStorage* cache = env.step->kv;
  const int64_t H = a.num_heads, dh = a.head_dim, width = H * dh;
  const int64_t n = in[0].dim(0);
  KILN_CHECK(L.total_tokens() == n, "node '{}': step layout covers {} tokens, input has {}",
             node.name, L.total_tokens(), n);

  const float* q;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = width, kv_stride = width;
  size_t next = 1;
  if (a.packed_qkv) {
    q = in[0].data<float>();
    k = q + width;
    v = q + 2 * width;
    q_stride = kv_stride = 3 * width;
  } else {
    q = in[0].data<float>();
    if (a.kind != AttentionKind::kCross) {
      k = in[1].data<float>();
      v = in[2].data<float>();
      next = 3;
    }
  }
  const float* rel_table = a.bias == PositionBias::kT5Relative ? in[next].data<float>() : nullptr;
  const std::vector<float> slopes =
      a.bias == PositionBias::kAlibi ? alibi_slopes(a.num_heads) : std::vector<float>{};
  float* y = out[0].data<float>();

  if (a.kind == AttentionKind::kCachedSelf) {
    KILN_CHECK(cache != nullptr, "node '{}': cached attention without a KV cache", node.name);
    const KvGeometry& geo = cache->geometry();
    KILN_CHECK(geo.row_width == width && geo.dtype == DType::kF32 && a.layer < geo.layers,
               "node '{}': KV cache holds {} layers of {} rows {} wide, need layer {} of f32 rows "
               "{} wide",
               node.name, geo.layers, dtype_name(geo.dtype), geo.row_width, a.layer, width);
    for (int s = 0; s < L.num_seqs(); ++s)
      append_to_cache(L, s, cache, a.layer, k, v, kv_stride, width);
  }

  const int64_t nseq = L.num_seqs();
  env.pool.parallel_for(nseq * H, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(dh));
    for (int64_t work = w0; work < w1; ++work) {
      const int si = static_cast<int>(work / H);
      const int64_t h = work % H;
      const int64_t token_begin = L.token_begin[si], num_tokens = L.num_tokens(si);
      const int64_t past_len = L.past_len[si];
      const CrossKv* cross = L.cross[si];
      DenseRows dense_k, dense_v;
      PagedRows paged_k, paged_v;
      const Rows* keys = nullptr;
      const Rows* vals = nullptr;
      int64_t key_len = 0;
      switch (a.kind) {
        case AttentionKind::kEncoderSelf:
          dense_k.base = k + token_begin * kv_stride + h * dh;
          dense_v.base = v + token_begin * kv_stride + h * dh;
          dense_k.stride = dense_v.stride = kv_stride;
          keys = &dense_k;
          vals = &dense_v;
          key_len = num_tokens;
          break;
        case AttentionKind::kCachedSelf:
          paged_k = PagedRows{};
          paged_k.cache = cache;
          paged_k.layer = a.layer;
          paged_k.blocks = L.blocks(si);
          paged_k.block_size = cache->geometry().block_size;
          paged_k.width = width;
          paged_v = paged_k;
          paged_k.keys = true;
          paged_v.keys = false;
          keys = &paged_k;
          vals = &paged_v;
          key_len = past_len + num_tokens;
          break;
        case AttentionKind::kCross:
          KILN_CHECK(cross != nullptr && a.layer < static_cast<int>(cross->keys.size()),
                     "node '{}': sequence has no cross K/V for layer {}", node.name, a.layer);
          dense_k.base = cross->keys[a.layer].data<float>() + h * dh;
          dense_v.base = cross->values[a.layer].data<float>() + h * dh;
          dense_k.stride = dense_v.stride = width;
          keys = &dense_k;
          vals = &dense_v;
          key_len = cross->length();
          break;
      }
      // Key rows are offset by the head inside the row for paged storage too.
      const int64_t head_off = a.kind == AttentionKind::kCachedSelf ? h * dh : 0;
      scores.resize(static_cast<size_t>(key_len));
      for (int64_t i = 0; i < num_tokens; ++i) {
        const int64_t qpos = (a.kind == AttentionKind::kCachedSelf ? past_len : 0) + i;
        const float* qr = q + (token_begin + i) * q_stride + h * dh;
        const int64_t visible = a.causal ? std::min(key_len, qpos + 1) : key_len;
        float mx = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          float sc = dot(qr, keys->row(j) + head_off, dh) * a.scale;
          switch (a.bias) {
            case PositionBias::kNone:
              break;
            case PositionBias::kT5Relative:
              sc += rel_table[t5_relative_bucket(j - qpos, a.bidirectional_buckets, a.num_buckets,
                                                 a.max_distance) *
                                  H +
                              h];
              break;
            case PositionBias::kAlibi:
              sc += slopes[h] * static_cast<float>(j);
              break;
          }
          scores[j] = sc;
          mx = std::max(mx, sc);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
        const float inv = 1.0f / sum;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          const float p = scores[j] * inv;
          const float* vr = vals->row(j) + head_off;
          for (int64_t d = 0; d < dh; ++d) acc[d] += p * vr[d];
        }
        std::memcpy(y + (token_begin + i) * width + h * dh, acc.data(), dh * sizeof(float));
      }
    }
  });
}

}  // namespace kiln::cpu
