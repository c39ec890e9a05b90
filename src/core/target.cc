#include "core/target.h"

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
std::string_view precision_names() { return "fp32, fp16, bf16, int8, int8-weight"; }

}  // namespace kiln
