// Which devices this build runs (a CUDA build, a GPU), with core/target.h's table of which
// precisions each runs, and the backend for a device: the one place the builder, the plan loader
// and the CLI ask.
#include "backend/backend.h"

namespace kiln {

std::string target_unsupported_reason(Device device, Precision precision) {
  if (device.kind == Device::kCuda) {
    const CudaInfo cuda = query_cuda();
    if (!cuda.compiled) return cuda.error;
    // FP8 tensor cores and conversions: sm_89 (Ada) and newer (a build without a GPU targets
    // sm_90).
    if (precision == Precision::kFp8 && cuda.first_sm > 0 && cuda.first_sm < 89)
      return fmt::format(
          "fp8 needs FP8 tensor cores (sm_89 or newer: Ada, Hopper); this GPU is {} (not fp8): "
          "build int8 (W8A8) or int8-weight instead",
          cuda.first_device);
  }
  const PrecisionSupport& s = precision_support(device, precision);
  if (s.supported) return {};
  return fmt::format("{} (not {})", s.unsupported, precision_name(precision));
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
