// Attention from its definition, one (sequence, head, query) at a time, in double:
//   score_j = scale * q . k_j + bias(query position, key position j)   for every visible key j
//   out     = sum_j softmax(score)_j * v_j
// The kinds differ only in where a sequence's keys and values come from: its own rows of this
// step (encoder self), its paged cache after this step's rows are appended (cached self), or
// its request's cross K/V (cross). Positions count from the start of the sequence; a causal
// query sees the keys at or before its own position. T5's relative bias indexes the table by
// the bucket of key_pos - query_pos; BLOOM's ALiBi adds slope(head) * key_pos (HF builds it from
// cumsum(mask) - 1, the key's position; the query's share cancels in the softmax).
#include <cmath>

#include "backend/reference/kernels.h"

namespace kiln::reference {
namespace {

// This step's q, k and v rows: three [n, H*dh] inputs, or one packed [n, 3*H*dh] input whose
// rows are laid out [3, H, dh] (the BLOOM frontend regroups HF's [H, 3, dh] into this order).
struct StepRows {
  const Tensor* q = nullptr;
  const Tensor* k = nullptr;
  const Tensor* v = nullptr;
  int64_t stride = 0;  // elements per row
  int64_t k_offset = 0, v_offset = 0;

  double q_at(int64_t row, int64_t col) const {
    return element(q->raw(), q->dtype(), row * stride + col);
  }
  double k_at(int64_t row, int64_t col) const {
    return element(k->raw(), k->dtype(), row * stride + k_offset + col);
  }
  double v_at(int64_t row, int64_t col) const {
    return element(v->raw(), v->dtype(), row * stride + v_offset + col);
  }
};

// Position `pos` of a sequence's cache rows for `layer`: the block holding it and the first
// element of its row in that block.
struct CacheSlot {
  int32_t block;
  int64_t offset;
};
CacheSlot cache_slot(const Node& node, const KvStorage& kv, std::span<const int32_t> blocks,
                     int64_t pos) {
  const KvGeometry& g = kv.geometry();
  const int64_t index = pos / g.block_size;
  KILN_CHECK(index < static_cast<int64_t>(blocks.size()) && blocks[index] >= 0 &&
                 blocks[index] < kv.capacity(),
             "node '{}': position {} has no KV block (block table entry {})", node.name, pos,
             index < static_cast<int64_t>(blocks.size()) ? blocks[index] : -1);
  return {blocks[index], (pos % g.block_size) * g.row_width};
}

// One head's keys and values of one sequence: [len, dh] each, in double.
struct HeadKv {
  std::vector<double> keys, values;
  int64_t length = 0;
};

HeadKv head_kv(const Node& node, const AttentionAttrs& a, const StepLayout& layout, int s,
               const StepRows& rows, KvStorage* kv, int64_t h) {
  const int64_t dh = a.head_dim, width = static_cast<int64_t>(a.num_heads) * dh;
  HeadKv out;
  auto add_row = [&](auto&& key_at, auto&& value_at) {
    for (int64_t c = h * dh; c < (h + 1) * dh; ++c) {
      out.keys.push_back(key_at(c));
      out.values.push_back(value_at(c));
    }
    ++out.length;
  };
  switch (a.kind) {
    case AttentionKind::kEncoderSelf:
      for (int64_t r = layout.token_begin[s]; r < layout.token_begin[s + 1]; ++r)
        add_row([&](int64_t c) { return rows.k_at(r, c); },
                [&](int64_t c) { return rows.v_at(r, c); });
      break;
    case AttentionKind::kCachedSelf: {
      const DType dtype = kv->geometry().dtype;
      for (int64_t pos = 0; pos < layout.past_len[s] + layout.num_tokens(s); ++pos) {
        const CacheSlot slot = cache_slot(node, *kv, layout.blocks(s), pos);
        const void* k = kv->key_block(a.layer, slot.block);
        const void* v = kv->value_block(a.layer, slot.block);
        add_row([&](int64_t c) { return element(k, dtype, slot.offset + c); },
                [&](int64_t c) { return element(v, dtype, slot.offset + c); });
      }
      break;
    }
    case AttentionKind::kCross: {
      const CrossKv* cross = layout.cross[s];
      KILN_CHECK(cross != nullptr && a.layer >= 0 &&
                     a.layer < static_cast<int>(cross->keys.size()) &&
                     a.layer < static_cast<int>(cross->values.size()),
                 "node '{}': sequence {} has no cross K/V for layer {}", node.name, s, a.layer);
      const Tensor& k = cross->keys[a.layer];
      const Tensor& v = cross->values[a.layer];
      KILN_CHECK(k.rank() == 2 && k.dim(1) == width && v.shape() == k.shape() &&
                     k.device() == Device::kCpu && v.device() == Device::kCpu,
                 "node '{}': cross K/V of sequence {} are {} and {} host tensors, expected [len, "
                 "{}] each",
                 node.name, s, shape_str(k.shape()), shape_str(v.shape()), width);
      for (int64_t r = 0; r < k.dim(0); ++r)
        add_row([&](int64_t c) { return element(k.raw(), k.dtype(), r * width + c); },
                [&](int64_t c) { return element(v.raw(), v.dtype(), r * width + c); });
      break;
    }
  }
  return out;
}

// Writes this step's K/V rows of every sequence at positions past_len.. of its cache blocks.
void append_to_cache(const Node& node, const AttentionAttrs& a, const StepLayout& layout,
                     const StepRows& rows, KvStorage& kv) {
  const KvGeometry& g = kv.geometry();
  for (int s = 0; s < layout.num_seqs(); ++s)
    for (int64_t i = 0; i < layout.num_tokens(s); ++i) {
      const int64_t row = layout.token_begin[s] + i;
      const CacheSlot slot = cache_slot(node, kv, layout.blocks(s), layout.past_len[s] + i);
      void* k = kv.key_block(a.layer, slot.block);
      void* v = kv.value_block(a.layer, slot.block);
      for (int64_t c = 0; c < g.row_width; ++c) {
        set_element(k, g.dtype, slot.offset + c, rows.k_at(row, c));
        set_element(v, g.dtype, slot.offset + c, rows.v_at(row, c));
      }
    }
}

}  // namespace

// q, k, v [n, H*dh] (or qkv [n, 3*H*dh] packed, or q alone for cross), then the relative-bias
// table [num_buckets, H] when bias == kT5Relative -> [n, H*dh]
void attention(const Node& node, const KernelArgs& args) {
  const AttentionAttrs& a = node.attr<AttentionAttrs>();
  KILN_CHECK(args.step != nullptr && args.step->layout != nullptr,
             "node '{}': attention needs the step's layout", node.name);
  const StepLayout& layout = *args.step->layout;
  const int64_t H = a.num_heads, dh = a.head_dim, width = H * dh;
  const int64_t n = args.in[0].dim(0);
  KILN_CHECK(layout.total_tokens() == n, "node '{}': step layout covers {} tokens, input has {}",
             node.name, layout.total_tokens(), n);
  // HF's cross attention has no position bias and no mask: keys are not positions of the query's
  // sequence, so neither would mean anything.
  KILN_CHECK(a.kind != AttentionKind::kCross || (a.bias == PositionBias::kNone && !a.causal),
             "node '{}': cross attention takes no position bias and is not causal", node.name);

  StepRows rows;
  rows.q = &args.in[0];
  size_t next = 1;
  if (a.packed_qkv) {
    rows.k = rows.v = &args.in[0];
    rows.stride = 3 * width;
    rows.k_offset = width;
    rows.v_offset = 2 * width;
  } else {
    rows.stride = width;
    if (a.kind != AttentionKind::kCross) {
      rows.k = &args.in[1];
      rows.v = &args.in[2];
      next = 3;
    }
  }
  const Tensor* table = a.bias == PositionBias::kT5Relative ? &args.in[next] : nullptr;
  const std::vector<double> slopes =
      a.bias == PositionBias::kAlibi ? alibi_slopes(a.num_heads) : std::vector<double>{};

  KvStorage* kv = args.step->kv;
  if (a.kind == AttentionKind::kCachedSelf) {
    KILN_CHECK(kv != nullptr, "node '{}': cached attention without KV storage", node.name);
    const KvGeometry& g = kv->geometry();
    KILN_CHECK(g.row_width == width && a.layer >= 0 && a.layer < g.layers,
               "node '{}': KV storage holds {} layers of rows {} wide, need layer {} of rows {} "
               "wide",
               node.name, g.layers, g.row_width, a.layer, width);
    append_to_cache(node, a, layout, rows, *kv);
  }

  Tensor& y = args.out[0];
  for (int s = 0; s < layout.num_seqs(); ++s)
    for (int64_t h = 0; h < H; ++h) {
      const HeadKv keys = head_kv(node, a, layout, s, rows, kv, h);
      for (int64_t i = 0; i < layout.num_tokens(s); ++i) {
        const int64_t row = layout.token_begin[s] + i;
        const int64_t q_pos = (a.kind == AttentionKind::kCachedSelf ? layout.past_len[s] : 0) + i;
        const int64_t visible = a.causal ? std::min(keys.length, q_pos + 1) : keys.length;
        KILN_CHECK(visible > 0, "node '{}': token {} of sequence {} sees no key", node.name, i, s);
        std::vector<double> score(static_cast<size_t>(visible));
        double max_score = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < dh; ++d)
            dot += rows.q_at(row, h * dh + d) * keys.keys[j * dh + d];
          double bias = 0.0;
          switch (a.bias) {
            case PositionBias::kNone:
              break;
            case PositionBias::kT5Relative: {
              const int bucket =
                  t5_bucket(j - q_pos, a.bidirectional_buckets, a.num_buckets, a.max_distance);
              bias = element(table->raw(), table->dtype(), bucket * H + h);
              break;
            }
            case PositionBias::kAlibi:
              bias = slopes[h] * static_cast<double>(j);
              break;
          }
          score[j] = static_cast<double>(a.scale) * dot + bias;
          max_score = std::max(max_score, score[j]);
        }
        double sum = 0.0;
        for (double& sc : score) sum += (sc = std::exp(sc - max_score));
        for (int64_t d = 0; d < dh; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < visible; ++j) acc += score[j] / sum * keys.values[j * dh + d];
          set_element(y.raw(), y.dtype(), row * width + h * dh + d, acc);
        }
      }
    }
}

}  // namespace kiln::reference
