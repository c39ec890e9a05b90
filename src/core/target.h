// What a plan targets: the device it runs on and the precision its weights are computed in.
// This is the one place that names them and says which device runs which precision how
// (precision_support): the CLI's refusals, the builder, the precision pass, the plan loader and
// the tests all ask it.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace kiln {

// A device: its kind and, for GPUs, which one (the CUDA ordinal; 0 for the CPU). A plan names
// only the kind; a backend is made for one device (make_backend). Comparing with a kind
// (`t.device() == Device::kCuda`) asks for the kind alone, comparing two devices for both.
struct Device {
  enum Kind : uint8_t { kCpu, kCuda };
  Kind kind = kCpu;
  int ordinal = 0;
  constexpr Device() = default;
  constexpr Device(Kind k, int n = 0)
      : kind(k), ordinal(n) {}  // NOLINT(google-explicit-constructor)
  constexpr auto operator<=>(const Device&) const = default;
  constexpr bool operator==(const Device&) const = default;
  constexpr bool operator==(Kind k) const { return kind == k; }
};
inline constexpr Device::Kind kAllDevices[] = {Device::kCpu, Device::kCuda};

enum class Precision : uint8_t {
  kFp32,        // fp32 weights and activations
  kFp16,        // fp16 weights; accumulation in fp32
  kBf16,        // bf16 weights; norms, softmax and accumulation in fp32
  kInt8,        // int8 weights and activations (calibrated)
  kInt8Weight,  // int8 weights with per-channel scales; fp32 activations (CPU), fp16 (CUDA)
  kInt4Weight,  // int4 weights with fp16 scales per group of 128 inputs, fp32 activations
  kFp8,         // FP8 (E4M3) weights with per-channel scales and calibrated FP8 Linear inputs
};
inline constexpr Precision kAllPrecisions[] = {
    Precision::kFp32,       Precision::kFp16,       Precision::kBf16, Precision::kInt8,
    Precision::kInt8Weight, Precision::kInt4Weight, Precision::kFp8};

std::string_view device_name(Device device);           // "cpu", "cuda" (the kind's name)
std::string device_label(Device device);               // "cpu", "cuda:1" (with a GPU's ordinal)
std::string_view precision_name(Precision precision);  // "fp32", "bf16", "int8-weight", ...
// False for an unknown name (callers report it with the list of known names).
bool parse_device(std::string_view name, Device* out);
bool parse_precision(std::string_view name, Precision* out);
// "cpu, cuda" / "fp32, fp16, ..." for error messages and --help.
std::string_view device_names();
std::string_view precision_names();

// How a device runs a precision: the type its weight matrices (Linear weights, Embedding tables)
// are stored in, the type activations flow in between nodes (the CPU keeps f32 activations and
// narrows only weight storage; CUDA computes fp16/bf16 plans in that type), whether matrices carry
// per-output-channel f32 scales, and why not when the device does not run it. int4-weight stores
// Linear weights as i4 with group scales (graph/linear.h) and every other matrix as int8-weight
// does (`matrix` is i4; the precision pass says which matrices stay i8, and why). Whether a device
// is present (a CUDA build, a GPU) is the backend's to say (backend/backend.h).
struct PrecisionSupport {
  Device device;
  Precision precision;
  bool supported;
  DType matrix;      // Linear weights and Embedding tables
  DType activation;  // values between nodes
  bool channel_scales;
  // W8A8 (and fp8): Linears read their input as int8 (E4M3) with a static per-tensor scale
  // each, which a build takes from a calibration (--calib prompts or a --calib-cache); the rest
  // stays `activation`.
  bool calibrated_inputs;
  std::string_view unsupported;  // why not (when !supported)
};
// The one table of (device, precision) → PrecisionSupport.
const PrecisionSupport& precision_support(Device device, Precision precision);
// The precisions `device` runs, for --help and error messages ("fp32, fp16, bf16").
std::string supported_precision_names(Device device);

// What the paged self-attention KV cache stores (`kiln build --kv-cache`, kept in the plan):
// kAuto, the type the decoder's attention computes in (or the narrower one its backend picks:
// bf16 for the CPU's narrow plans); kFp8, E4M3 with a scale of 1 (values saturate at ±448; CUDA
// only), half the bytes of an fp16 cache. Cross attention's K/V are not cached this way.
enum class KvCache : uint8_t { kAuto, kFp8 };
inline constexpr KvCache kAllKvCaches[] = {KvCache::kAuto, KvCache::kFp8};
std::string_view kv_cache_name(KvCache kv);  // "auto", "fp8"
bool parse_kv_cache(std::string_view name, KvCache* out);
// Why `device` cannot keep its KV cache as `kv` (empty: it can).
std::string_view kv_cache_refusal(Device device, KvCache kv);

}  // namespace kiln
