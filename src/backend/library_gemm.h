// A vendor library's GEMM timed on this machine: the yardstick `kiln bench` sets a plan's prompt
// step against, which each backend answers for its device (Backend::time_library_gemm: oneDNN's
// matmul on the CPU).
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

// The operands' types: f32 × f32, bf16 × bf16, or u8 activations × s8 weights (int8, as an
// int8-weight plan's dot products quantize their inputs); f32 results in every case.
enum class LibraryGemmType : uint8_t { kF32, kBf16, kInt8 };

// "f32", "bf16", "u8s8".
inline const char* library_gemm_type_name(LibraryGemmType type) {
  switch (type) {
    case LibraryGemmType::kF32:
      return "f32";
    case LibraryGemmType::kBf16:
      return "bf16";
    case LibraryGemmType::kInt8:
      return "u8s8";
  }
  return "?";
}

struct LibraryGemmTiming {
  double ms = 0.0;   // median of the timed runs (after one untimed)
  std::string impl;  // the library's implementation for the shape ("brg:avx512_core", ...)
};

}  // namespace kiln
