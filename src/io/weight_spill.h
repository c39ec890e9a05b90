// Where a build keeps the weights its passes make (converted, stacked, folded, packed): written
// to an unlinked temporary file as each is made and read back through a read-only mapping, so
// that `kiln build`'s resident memory is that of the tensors it is working on, not of the model
// (the page cache holds the rest, and gives it back under pressure). A weight that is dropped
// frees its range of the file (a hole is punched), so the file stays the size of the weights
// alive. Active for the thread that holds a WeightSpill::Scope (the builder's); Graph's weight
// setters spill through it, and without one everything stays in memory as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace kiln {

class WeightSpill : public std::enable_shared_from_this<WeightSpill> {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  // A spill file in `dir` (created and unlinked at once) for tensors of at least `min_bytes`.
  // Throws naming the folder on failure.
  static std::shared_ptr<WeightSpill> create(const std::string& dir, size_t min_bytes = kMinBytes);
  ~WeightSpill();
  WeightSpill(const WeightSpill&) = delete;
  WeightSpill& operator=(const WeightSpill&) = delete;

  // `t` as a file-backed tensor of the same dtype and shape: an owned CPU tensor of at least
  // min_bytes is written out and its memory freed with the last reference to it; anything else
  // (small, already a mapping, a view, on a device) is returned as it is.
  Tensor put(Tensor t);

  int64_t bytes_written() const { return written_; }

  // Makes `spill` the one Graph's weight setters use on this thread until the scope ends.
  class Scope {
   public:
    explicit Scope(std::shared_ptr<WeightSpill> spill);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::shared_ptr<WeightSpill> previous_;
  };
  // The spill of this thread's innermost Scope, or null.
  static WeightSpill* active();

 private:
  WeightSpill() = default;
  void release(uint64_t offset, size_t bytes);

  int fd_ = -1;
  size_t min_bytes_ = kMinBytes;
  uint64_t end_ = 0;  // next free offset (page aligned)
  int64_t written_ = 0;
  std::string dir_;
};

}  // namespace kiln
