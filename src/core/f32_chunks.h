// Reading a tensor of any float type as f32 a chunk at a time: the conversions, scans and folds
// of a build stream a (mapped) weight through a small buffer instead of an f32 copy of it, and
// give back each chunk's pages of a file-backed tensor once it is read, so that the resident
// memory of a 7B model's build is not its weights in f32.
#pragma once

#include <cstddef>
#include <functional>

#include "core/tensor.h"

namespace kiln {

// Calls fn(values, first, count) for consecutive chunks of `chunk` elements (the last one
// shorter) of contiguous tensor t, the values as f32: a view of t itself when it is f32, else a
// buffer reused for every chunk (valid during the call). A caller that walks rows passes a
// multiple of the row length. fn returns false to stop; the result is false when it did.
bool for_each_f32_chunk(
    const Tensor& t, size_t chunk,
    const std::function<bool(const float* values, size_t first, size_t count)>& fn);

}  // namespace kiln
