// Tensor: shape, strides, dtype and device over a storage that is either owned (aligned heap
// allocation) or a view of memory that something else keeps alive (an mmapped file).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/target.h"

namespace kiln {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

// Memory a tensor points into. `keep_alive` holds whatever owns the bytes (a mapping, a vector).
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::kCpu;
  std::shared_ptr<void> keep_alive;
  // The bytes are a read-only mapping of a file (a checkpoint, a build's spilled weights): their
  // pages can be dropped from this process's resident memory and come back from the page cache
  // when read again (release_pages).
  bool file_backed = false;
};

// Drops the whole pages inside [data, data + bytes) of a read-only file mapping from resident
// memory (madvise MADV_DONTNEED); they are read again from the file when touched. Only for
// mappings that were never written: anonymous memory would lose its contents.
void release_file_pages(const void* data, size_t bytes);

class Tensor {
 public:
  Tensor() = default;
  // A new zero-filled, 64-byte-aligned CPU tensor.
  static Tensor empty(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape) { return empty(dtype, std::move(shape)); }
  // A view over `data` (in `device` memory), kept alive by `owner`; no copy.
  static Tensor view(DType dtype, Shape shape, const void* data, std::shared_ptr<void> owner,
                     Device device = Device::kCpu);
  // A view over a read-only file mapping (see Storage::file_backed).
  static Tensor mapped(DType dtype, Shape shape, const void* data, std::shared_ptr<void> owner);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape) {
    Tensor t = empty(dtype_of<T>(), std::move(shape));
    KILN_CHECK(static_cast<size_t>(t.numel()) == values.size(), "from_vector: {} values for {}",
               values.size(), shape_str(t.shape()));
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::kCpu; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return dtype_bytes(dtype_, static_cast<size_t>(numel())); }
  bool is_contiguous() const;
  // True when the bytes belong to this tensor's storage (false for views of a mapping).
  bool owns_memory() const { return owns_; }
  // Whether the bytes are a read-only file mapping (Storage::file_backed).
  bool file_backed() const { return storage_ && storage_->file_backed; }
  // A file-backed tensor's pages leave resident memory (no-op otherwise): a build that has read
  // a weight releases it, so that its resident memory stays that of the tensors it works on.
  void release_pages() const;

  void* raw() { return static_cast<char*>(storage_->data) + offset_; }
  const void* raw() const { return static_cast<const char*>(storage_->data) + offset_; }
  template <typename T>
  T* data() {
    KILN_CHECK(dtype_of<T>() == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_),
               dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }
  template <typename T>
  const T* data() const {
    KILN_CHECK(dtype_of<T>() == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_),
               dtype_name(dtype_of<T>()));
    return static_cast<const T*>(raw());
  }

  // Same storage, new shape (must have the same number of elements; tensor contiguous).
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // A contiguous tensor of `dtype` and `shape` at `byte_offset` from this tensor's first byte,
  // sharing its storage (which must hold it): many views of one buffer without an allocation of
  // shared state each.
  Tensor view_at(DType dtype, Shape shape, size_t byte_offset) const;
  // A contiguous f32 copy (converting from f16/bf16/ints through the traits table).
  Tensor to_f32() const;
  // Converts to `dtype` (f32 source only, or identity copy).
  Tensor to(DType dtype) const;
  Tensor clone() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
  bool owns_ = false;
};

}  // namespace kiln
