#include "server/gpu_metrics.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include "server/exposition.h"

// NVML's types and constants come from its header where the CUDA toolkit is installed; without
// it the few used here are declared below (NVML's ABI is stable: these layouts have not changed
// since NVML's first release). No function of the header is called directly: each is looked up
// in the library at run time, so nothing links against NVML. NVML_NO_UNVERSIONED_FUNC_DEFS keeps
// the header from #defining nvmlInit to nvmlInit_v2 and the like.
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#if __has_include(<nvml.h>)
#include <nvml.h>
#define KILN_NVML_HEADER 1
#elif __has_include("/usr/local/cuda/include/nvml.h")
#include "/usr/local/cuda/include/nvml.h"
#define KILN_NVML_HEADER 1
#endif

namespace kiln::server {

namespace {

#ifndef KILN_NVML_HEADER
// int rather than a partial enum: NVML returns codes a partial enum would not cover.
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of the last sample period a kernel was running
  unsigned int memory;  // percent of it device memory was read or written
};
struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};
using nvmlClockType_t = int;
constexpr nvmlClockType_t NVML_CLOCK_SM = 1;
#endif

// NVML's largest name and UUID buffers (NVML_DEVICE_{NAME,UUID}_V2_BUFFER_SIZE).
constexpr unsigned int kStringBuffer = 96;

// nvmlMemory_v2_t (declared here whatever the header: older headers lack it). Its `used`
// leaves out the memory the driver reserves, as nvidia-smi and DCGM (Triton's source) report;
// version 1's `used` counts that reserve too (some 600 MiB on an idle H200).
struct MemoryV2 {
  unsigned int version;
  unsigned long long total, reserved, free, used;  // bytes
};
// NVML_STRUCT_VERSION(Memory, 2).
constexpr unsigned int kMemoryV2Version = static_cast<unsigned int>(sizeof(MemoryV2)) | (2u << 24);

}  // namespace

struct GpuMetrics::Nvml {
  void* lib = nullptr;
  bool initialized = false;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;                 // optional
  const char* (*error_string)(nvmlReturn_t) = nullptr;  // optional
  nvmlReturn_t (*get_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*get_handle)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*get_memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*get_memory_v2)(nvmlDevice_t, MemoryV2*) = nullptr;  // optional (drivers >= 510)
  nvmlReturn_t (*get_clock)(nvmlDevice_t, nvmlClockType_t, unsigned int*) = nullptr;
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*get_uuid)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*get_power)(nvmlDevice_t, unsigned int*) = nullptr;  // milliwatts

  struct Device {
    nvmlDevice_t handle;
    std::string uuid, name;
  };
  std::vector<Device> devices;  // enumerated once: devices do not come and go under a server

  ~Nvml() {
    if (initialized && shutdown != nullptr) shutdown();
    if (lib != nullptr) dlclose(lib);
  }
  std::string error(nvmlReturn_t r) const {
    const char* s = error_string != nullptr ? error_string(r) : nullptr;
    return s != nullptr ? fmt::format("{} (NVML error {})", s, static_cast<int>(r))
                        : fmt::format("NVML error {}", static_cast<int>(r));
  }
  // Looks `name` up; records the first missing one in `missing`.
  template <typename Fn>
  void bind(Fn& fn, const char* name, std::string* missing) {
    fn = reinterpret_cast<Fn>(dlsym(lib, name));
    if (fn == nullptr && missing != nullptr && missing->empty()) *missing = name;
  }
};

GpuMetrics::GpuMetrics(std::unique_ptr<Nvml> nvml) : nvml_(std::move(nvml)) {}
GpuMetrics::~GpuMetrics() = default;

std::unique_ptr<GpuMetrics> GpuMetrics::open(std::string* why_not) {
  return open_library("libnvidia-ml.so.1", why_not);
}

std::unique_ptr<GpuMetrics> GpuMetrics::open_library(const std::string& soname,
                                                     std::string* why_not) {
  auto fail = [&](std::string reason) -> std::unique_ptr<GpuMetrics> {
    if (why_not != nullptr) *why_not = std::move(reason);
    return nullptr;
  };
  auto n = std::make_unique<Nvml>();
  n->lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (n->lib == nullptr) {
    const char* e = dlerror();
    return fail(fmt::format("no GPU metrics: {} cannot be loaded ({}): no NVIDIA driver", soname,
                            e != nullptr ? e : "unknown error"));
  }
  std::string missing;
  n->bind(n->init, "nvmlInit_v2", &missing);
  n->bind(n->get_count, "nvmlDeviceGetCount_v2", &missing);
  n->bind(n->get_handle, "nvmlDeviceGetHandleByIndex_v2", &missing);
  n->bind(n->get_utilization, "nvmlDeviceGetUtilizationRates", &missing);
  n->bind(n->get_memory, "nvmlDeviceGetMemoryInfo", &missing);
  n->bind(n->get_clock, "nvmlDeviceGetClockInfo", &missing);
  n->bind(n->get_name, "nvmlDeviceGetName", &missing);
  n->bind(n->get_uuid, "nvmlDeviceGetUUID", &missing);
  n->bind(n->get_power, "nvmlDeviceGetPowerUsage", &missing);
  n->bind(n->get_memory_v2, "nvmlDeviceGetMemoryInfo_v2", nullptr);
  n->bind(n->shutdown, "nvmlShutdown", nullptr);
  n->bind(n->error_string, "nvmlErrorString", nullptr);
  if (!missing.empty())
    return fail(
        fmt::format("no GPU metrics: {} has no {} (not NVML, or too old)", soname, missing));
  if (nvmlReturn_t r = n->init(); r != NVML_SUCCESS)
    return fail(fmt::format("no GPU metrics: nvmlInit failed: {}", n->error(r)));
  n->initialized = true;
  unsigned int count = 0;
  if (nvmlReturn_t r = n->get_count(&count); r != NVML_SUCCESS)
    return fail(fmt::format("no GPU metrics: nvmlDeviceGetCount failed: {}", n->error(r)));
  std::string skipped;
  for (unsigned int i = 0; i < count; ++i) {
    Nvml::Device d{};
    char buf[kStringBuffer] = {};
    nvmlReturn_t r = n->get_handle(i, &d.handle);
    if (r == NVML_SUCCESS) r = n->get_uuid(d.handle, buf, kStringBuffer);
    if (r != NVML_SUCCESS) {
      // A device NVML cannot name (no permission, lost) cannot be labelled: leave it out.
      skipped += fmt::format("; GPU {} skipped: {}", i, n->error(r));
      continue;
    }
    d.uuid = buf;
    char name[kStringBuffer] = {};
    if (n->get_name(d.handle, name, kStringBuffer) == NVML_SUCCESS) d.name = name;
    n->devices.push_back(std::move(d));
  }
  if (n->devices.empty())
    return fail(
        fmt::format("no GPU metrics: NVML found no usable GPU ({} device(s){})", count, skipped));
  return std::unique_ptr<GpuMetrics>(new GpuMetrics(std::move(n)));
}

std::vector<GpuReading> GpuMetrics::read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<GpuReading> out;
  for (const Nvml::Device& d : nvml_->devices) {
    GpuReading g;
    g.uuid = d.uuid;
    g.name = d.name;
    nvmlUtilization_t u{};
    if (nvml_->get_utilization(d.handle, &u) == NVML_SUCCESS) g.utilization = u.gpu / 100.0;
    MemoryV2 m2{};
    m2.version = kMemoryV2Version;
    nvmlMemory_t m{};
    if (nvml_->get_memory_v2 != nullptr && nvml_->get_memory_v2(d.handle, &m2) == NVML_SUCCESS) {
      g.memory_total_bytes = m2.total;
      g.memory_used_bytes = m2.used;
    } else if (nvml_->get_memory(d.handle, &m) == NVML_SUCCESS) {
      g.memory_total_bytes = m.total;
      g.memory_used_bytes = m.used;
    }
    unsigned int milliwatts = 0;
    if (nvml_->get_power(d.handle, &milliwatts) == NVML_SUCCESS) g.power_watts = milliwatts / 1e3;
    unsigned int mhz = 0;
    if (nvml_->get_clock(d.handle, NVML_CLOCK_SM, &mhz) == NVML_SUCCESS) g.sm_clock_mhz = mhz;
    out.push_back(std::move(g));
  }
  return out;
}

std::string GpuMetrics::describe() const {
  std::string s = fmt::format("{} GPU(s):", nvml_->devices.size());
  for (size_t i = 0; i < nvml_->devices.size(); ++i)
    s += fmt::format("{} {} ({})", i == 0 ? "" : ",", nvml_->devices[i].name,
                     nvml_->devices[i].uuid);
  return s;
}

std::string render_gpu_metrics(const std::vector<GpuReading>& gpus) {
  Exposition out;
  auto family = [&](const char* name, const char* help, auto value) {
    out.family(name, MetricType::kGauge, help);
    for (const GpuReading& g : gpus)
      if (auto v = value(g)) out.sample(name, {{"gpu_uuid", g.uuid}}, static_cast<double>(*v));
  };
  family("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)",
         [](const GpuReading& g) { return g.utilization; });
  family("nv_gpu_memory_total_bytes", "GPU total memory, in bytes",
         [](const GpuReading& g) { return g.memory_total_bytes; });
  family("nv_gpu_memory_used_bytes", "GPU used memory, in bytes",
         [](const GpuReading& g) { return g.memory_used_bytes; });
  family("nv_gpu_power_usage", "GPU power usage in watts",
         [](const GpuReading& g) { return g.power_watts; });
  family("kiln_gpu_sm_clock_mhz", "GPU SM clock, in MHz",
         [](const GpuReading& g) { return g.sm_clock_mhz; });
  return out.take();
}

}  // namespace kiln::server
