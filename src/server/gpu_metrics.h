// GPU metrics through NVML, loaded at run time (dlopen of libnvidia-ml.so.1, the driver's
// library): kiln links no CUDA library for this, and a CPU-only machine simply has no GPU
// metrics. Triton's names (nv_gpu_utilization, nv_gpu_memory_total_bytes,
// nv_gpu_memory_used_bytes, nv_gpu_power_usage) plus kiln_gpu_sm_clock_mhz, labelled
// gpu_uuid="GPU-..." as Triton's are.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kiln::server {

// One device's readings; a value NVML could not give (not supported on this device, or the
// query failed) is absent and its sample left out.
struct GpuReading {
  std::string uuid;                   // "GPU-..."
  std::string name;                   // "NVIDIA H200"
  std::optional<double> utilization;  // 0..1 over NVML's last sample period
  std::optional<uint64_t> memory_total_bytes, memory_used_bytes;
  std::optional<double> power_watts;
  std::optional<uint32_t> sm_clock_mhz;
};

// The GPU families of the page; a pure function of the readings (tests use made-up ones).
std::string render_gpu_metrics(const std::vector<GpuReading>& gpus);

class GpuMetrics {
 public:
  // Null when there is nothing to report: no NVML library (no NVIDIA driver), a library without
  // the functions, NVML failing to start, or no device. `why_not` then says which, for one INFO
  // line.
  static std::unique_ptr<GpuMetrics> open(std::string* why_not);
  // The same from a named library (tests: a missing one, or one that is not NVML).
  static std::unique_ptr<GpuMetrics> open_library(const std::string& soname, std::string* why_not);
  ~GpuMetrics();
  GpuMetrics(const GpuMetrics&) = delete;
  GpuMetrics& operator=(const GpuMetrics&) = delete;

  // Reads every device now. Thread-safe (scrapes may overlap).
  std::vector<GpuReading> read() const;
  std::string render() const { return render_gpu_metrics(read()); }
  // "2 GPU(s): NVIDIA H200 (GPU-...), ..." for the startup log.
  std::string describe() const;

 private:
  struct Nvml;
  explicit GpuMetrics(std::unique_ptr<Nvml> nvml);
  std::unique_ptr<Nvml> nvml_;
  mutable std::mutex mutex_;  // around every NVML call
};

}  // namespace kiln::server
