// Which devices and precisions this build runs, and the backend for a device: the one place
// the builder, the plan loader and the CLI ask.
#include "backend/backend.h"

namespace kiln {

std::string target_unsupported_reason(Device device, Precision precision) {
  switch (device.kind) {
    case Device::kCpu:
      switch (precision) {
        case Precision::kFp32:
        case Precision::kFp16:
        case Precision::kBf16:
        case Precision::kInt8Weight:
          return {};
        case Precision::kInt8:
          return "int8 activations (calibrated with --calib) are not implemented on the cpu; "
                 "--precision int8-weight stores int8 weights and keeps fp32 activations";
      }
      return "unknown precision";
    case Device::kCuda: {
      const CudaInfo cuda = query_cuda();
      if (!cuda.compiled) return cuda.error;
      switch (precision) {
        case Precision::kFp32:
        case Precision::kFp16:
        case Precision::kBf16:
          return {};
        case Precision::kInt8:
        case Precision::kInt8Weight:
          break;
      }
      return fmt::format("the cuda backend runs fp32, fp16 and bf16 plans (not {})",
                         precision_name(precision));
    }
  }
  return "unknown device";
}

std::unique_ptr<Backend> make_backend(Context& ctx, Device device) {
  switch (device.kind) {
    case Device::kCpu:
      return make_cpu_backend(ctx);
    case Device::kCuda:
      return make_cuda_backend(ctx, device.ordinal);
  }
  KILN_FAIL_KIND(ErrorKind::kUsage, "device {}: {}", device_name(device),
                 target_unsupported_reason(device, Precision::kFp32));
}

}  // namespace kiln
