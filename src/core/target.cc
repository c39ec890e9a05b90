#include "core/target.h"

#include <string>

namespace kiln {

std::string_view device_name(Device device) {
  switch (device.kind) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

std::string device_label(Device device) {
  std::string label(device_name(device));
  if (device.kind != Device::kCpu) label += ":" + std::to_string(device.ordinal);
  return label;
}

std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
    case Precision::kInt8:
      return "int8";
    case Precision::kInt8Weight:
      return "int8-weight";
    case Precision::kInt4Weight:
      return "int4-weight";
    case Precision::kFp8:
      return "fp8";
  }
  return "?";
}

bool parse_device(std::string_view name, Device* out) {
  for (Device::Kind d : kAllDevices)
    if (device_name(d) == name) {
      *out = d;
      return true;
    }
  return false;
}

bool parse_precision(std::string_view name, Precision* out) {
  for (Precision p : kAllPrecisions)
    if (precision_name(p) == name) {
      *out = p;
      return true;
    }
  return false;
}

std::string_view device_names() { return "cpu, cuda"; }
std::string_view precision_names() {
  return "fp32, fp16, bf16, int8, int8-weight, int4-weight, fp8";
}

namespace {

constexpr std::string_view kNoFp8Cpu =
    "fp8 (E4M3 weights and calibrated E4M3 Linear inputs) runs on GPUs with FP8 tensor cores "
    "(sm_89 or newer, Hopper's sm_90: --device cuda); on the cpu, int8 (W8A8) and "
    "int8-weight/int4-weight quantize";

// Rows in kAllDevices × kAllPrecisions order.
constexpr PrecisionSupport kSupport[] = {
    {Device::kCpu, Precision::kFp32, true, DType::kF32, DType::kF32, false, false, {}},
    {Device::kCpu, Precision::kFp16, true, DType::kF16, DType::kF32, false, false, {}},
    {Device::kCpu, Precision::kBf16, true, DType::kBF16, DType::kF32, false, false, {}},
    {Device::kCpu, Precision::kInt8, true, DType::kI8, DType::kF32, true, true, {}},
    {Device::kCpu, Precision::kInt8Weight, true, DType::kI8, DType::kF32, true, false, {}},
    {Device::kCpu, Precision::kInt4Weight, true, DType::kI4, DType::kF32, true, false, {}},
    {Device::kCpu, Precision::kFp8, false, DType::kF8E4M3, DType::kF32, true, true, kNoFp8Cpu},
    {Device::kCuda, Precision::kFp32, true, DType::kF32, DType::kF32, false, false, {}},
    {Device::kCuda, Precision::kFp16, true, DType::kF16, DType::kF16, false, false, {}},
    {Device::kCuda, Precision::kBf16, true, DType::kBF16, DType::kBF16, false, false, {}},
    {Device::kCuda, Precision::kInt8, true, DType::kI8, DType::kF16, true, true, {}},
    {Device::kCuda, Precision::kInt8Weight, true, DType::kI8, DType::kF16, true, false, {}},
    {Device::kCuda, Precision::kInt4Weight, true, DType::kI4, DType::kF16, true, false, {}},
    {Device::kCuda, Precision::kFp8, true, DType::kF8E4M3, DType::kF16, true, true, {}},
};

}  // namespace

const PrecisionSupport& precision_support(Device device, Precision precision) {
  for (const PrecisionSupport& s : kSupport)
    if (s.device == device.kind && s.precision == precision) return s;  // any GPU ordinal
  return kSupport[0];  // unreachable: the table covers every pair (tested)
}

std::string supported_precision_names(Device device) {
  std::string names;
  for (Precision p : kAllPrecisions)
    if (precision_support(device, p).supported)
      names += (names.empty() ? "" : ", ") + std::string(precision_name(p));
  return names;
}

std::string_view kv_cache_name(KvCache kv) { return kv == KvCache::kFp8 ? "fp8" : "auto"; }

bool parse_kv_cache(std::string_view name, KvCache* out) {
  for (KvCache kv : kAllKvCaches)
    if (kv_cache_name(kv) == name) {
      *out = kv;
      return true;
    }
  return false;
}

std::string_view kv_cache_refusal(Device device, KvCache kv) {
  if (kv == KvCache::kFp8 && device == Device::kCpu)
    return "--kv-cache fp8 (E4M3 keys and values) runs on CUDA plans (--device cuda); the cpu's "
           "cache is f32, or bf16 in bf16, int8, int8-weight and int4-weight plans";
  return {};
}

}  // namespace kiln
