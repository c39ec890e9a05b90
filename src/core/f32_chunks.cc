#include "core/f32_chunks.h"

#include <algorithm>
#include <vector>

#include "core/status.h"

namespace kiln {

bool for_each_f32_chunk(const Tensor& t, size_t chunk,
                        const std::function<bool(const float*, size_t, size_t)>& fn) {
  KILN_CHECK(t.is_contiguous(), "a chunked f32 read of a non-contiguous tensor");
  KILN_CHECK(chunk > 0, "a chunked f32 read needs a chunk of at least one element");
  const size_t n = static_cast<size_t>(t.numel());
  const bool f32 = t.dtype() == DType::kF32;
  const DTypeTraits& traits = dtype_traits(t.dtype());
  KILN_CHECK(traits.to_float != nullptr, "{} has no f32 view", traits.name);
  KILN_CHECK(chunk % static_cast<size_t>(traits.block_elems) == 0,
             "a chunk of {} elements is not a whole number of {} blocks", chunk, traits.name);
  std::vector<float> buffer(f32 ? 0 : std::min(n, chunk));
  const char* base = static_cast<const char*>(t.raw());
  for (size_t i = 0; i < n; i += chunk) {
    const size_t m = std::min(chunk, n - i);
    const char* at = base + dtype_bytes(t.dtype(), i);
    const float* values = reinterpret_cast<const float*>(at);
    if (!f32) {
      traits.to_float(at, buffer.data(), m);
      values = buffer.data();
    }
    const bool go_on = fn(values, i, m);
    if (t.file_backed()) release_file_pages(at, dtype_bytes(t.dtype(), m));
    if (!go_on) return false;
  }
  return true;
}

}  // namespace kiln
