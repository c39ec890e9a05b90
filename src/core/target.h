// What a plan targets: the device it runs on and the precision its weights are computed in.
// This is the one place that names them; backends say which of them they support
// (Backend::supports_precision), and the CLI, plans and the builder all parse and print through
// these functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kiln {

enum class Device : uint8_t { kCpu, kCuda };
inline constexpr Device kAllDevices[] = {Device::kCpu, Device::kCuda};

enum class Precision : uint8_t {
  kFp32,        // fp32 weights and activations
  kFp16,        // fp16 weights; accumulation in fp32
  kBf16,        // bf16 weights; norms, softmax and accumulation in fp32
  kInt8,        // int8 weights and activations (calibrated)
  kInt8Weight,  // int8 weights with per-channel scales, fp32 activations
};
inline constexpr Precision kAllPrecisions[] = {Precision::kFp32, Precision::kFp16, Precision::kBf16,
                                               Precision::kInt8, Precision::kInt8Weight};

std::string_view device_name(Device device);           // "cpu", "cuda"
std::string_view precision_name(Precision precision);  // "fp32", "bf16", "int8-weight", ...
// False for an unknown name (callers report it with the list of known names).
bool parse_device(std::string_view name, Device* out);
bool parse_precision(std::string_view name, Precision* out);
// "cpu, cuda" / "fp32, fp16, ..." for error messages and --help.
std::string_view device_names();
std::string_view precision_names();

}  // namespace kiln
