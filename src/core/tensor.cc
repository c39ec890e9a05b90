#include "core/tensor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/f32_chunks.h"

namespace kiln {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    KILN_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    KILN_CHECK(!__builtin_mul_overflow(n, d, &n), "shape {} has too many elements",
               shape_str(shape));
  }
  return n;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

namespace {
Shape contiguous_strides(const Shape& shape) {
  shape_numel(shape);  // rejects negative and overflowing shapes before strides are formed
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // A zero dimension further out can leave the running product meaningless but it must not
    // overflow: saturate instead.
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s)) s = INT64_MAX;
  }
  return strides;
}
}  // namespace

Tensor Tensor::empty(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  const size_t bytes = t.nbytes();
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  KILN_CHECK(p != nullptr, "out of memory allocating {} bytes for a {} tensor {}", bytes,
             dtype_name(dtype), shape_str(t.shape_));
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  t.storage_ = std::make_shared<Storage>();
  t.storage_->data = p;
  t.storage_->bytes = bytes;
  t.storage_->keep_alive = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.owns_ = true;
  return t;
}

void release_file_pages(const void* data, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

Tensor Tensor::mapped(DType dtype, Shape shape, const void* data, std::shared_ptr<void> owner) {
  Tensor t = view(dtype, std::move(shape), data, std::move(owner));
  t.storage_->file_backed = true;
  return t;
}

void Tensor::release_pages() const {
  if (file_backed() && storage_->device == Device::kCpu) release_file_pages(raw(), nbytes());
}

Tensor Tensor::view(DType dtype, Shape shape, const void* data, std::shared_ptr<void> owner,
                    Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.storage_ = std::make_shared<Storage>();
  t.storage_->data = const_cast<void*>(data);
  t.storage_->bytes = t.nbytes();
  t.storage_->keep_alive = std::move(owner);
  t.storage_->device = device;
  t.owns_ = false;
  return t;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::reshape(Shape shape) const {
  KILN_CHECK(is_contiguous(), "reshape of a non-contiguous tensor");
  KILN_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_str(shape_),
             shape_str(shape));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  KILN_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
             "slice_rows [{}, {}) out of range for {}", begin, end, shape_str(shape_));
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ += dtype_bytes(dtype_, static_cast<size_t>(begin * strides_[0]));
  return t;
}

Tensor Tensor::view_at(DType dtype, Shape shape, size_t byte_offset) const {
  KILN_CHECK(defined(), "view_at of an undefined tensor");
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  KILN_CHECK(offset_ + byte_offset + t.nbytes() <= storage_->bytes,
             "view_at: {} bytes at offset {} do not fit a storage of {} bytes", t.nbytes(),
             offset_ + byte_offset, storage_->bytes);
  t.storage_ = storage_;
  t.offset_ = offset_ + byte_offset;
  t.owns_ = owns_;
  return t;
}

namespace {

// Converts src's elements to `dtype` into out (both contiguous, same element count) a chunk at a
// time through a small f32 buffer, giving back each chunk's pages of a file-backed src as it is
// done: converting a mapped 7B embedding table costs its output, not an f32 copy of the whole
// table beside all of the source's pages.
void convert_chunked(const Tensor& src, Tensor& out) {
  const DTypeTraits& to = dtype_traits(out.dtype());
  char* d = static_cast<char*>(out.raw());
  // A multiple of every block size.
  for_each_f32_chunk(src, size_t{1} << 20, [&](const float* values, size_t first, size_t n) {
    to.from_float(values, d + dtype_bytes(out.dtype(), first), n);
    return true;
  });
}

}  // namespace

Tensor Tensor::to_f32() const {
  KILN_CHECK(is_contiguous(), "to_f32 of a non-contiguous tensor");
  Tensor out = empty(DType::kF32, shape_);
  convert_chunked(*this, out);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  KILN_CHECK(is_contiguous(), "conversion of a non-contiguous tensor");
  Tensor out = empty(dtype, shape_);
  convert_chunked(*this, out);
  return out;
}

Tensor Tensor::clone() const {
  KILN_CHECK(is_contiguous(), "clone of a non-contiguous tensor");
  Tensor out = empty(dtype_, shape_);
  std::memcpy(out.raw(), raw(), nbytes());
  return out;
}

}  // namespace kiln
