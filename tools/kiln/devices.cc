#include "devices.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/cuda_info.h"

namespace kiln::cli {

std::string options_text(const std::vector<BackendOption>& options) {
  size_t width = 0;
  for (const BackendOption& o : options)
    width = std::max(width, o.variable.size() + 1 + o.value.size());
  std::string text;
  for (const BackendOption& o : options)
    text += fmt::format("  {:<{}}  {}\n", o.variable + "=" + o.value, width, o.meaning);
  return text;
}

nlohmann::json options_json(const std::vector<BackendOption>& options) {
  nlohmann::json j = nlohmann::json::object();
  for (const BackendOption& o : options) j[o.variable] = o.value;
  return j;
}

std::vector<DeviceEntry> device_report(Context& ctx) {
  std::vector<DeviceEntry> report;
  const std::unique_ptr<Backend> cpu = make_cpu_backend(ctx);
  report.push_back({"cpu", cpu->describe(), cpu->options()});
  const CudaInfo info = query_cuda();
  DeviceEntry cuda{"cuda", "", {}};
  if (info.device_count > 0)
    cuda.summary = fmt::format("{} GPU(s), GPU 0: {}", info.device_count, info.first_device);
  else
    cuda.summary =
        "unavailable: " + (info.error.empty() ? std::string("no GPU visible") : info.error);
  cuda.options = cuda_options();
  report.push_back(std::move(cuda));
  return report;
}

nlohmann::json device_report_json(const std::vector<DeviceEntry>& report) {
  nlohmann::json j = nlohmann::json::array();
  for (const DeviceEntry& d : report)
    j.push_back(
        {{"device", d.device}, {"summary", d.summary}, {"options", options_json(d.options)}});
  return j;
}

std::string device_report_text(const std::vector<DeviceEntry>& report) {
  std::string text;
  for (const DeviceEntry& d : report)
    text += fmt::format("device {}: {}\n", d.device, d.summary) + options_text(d.options);
  return text;
}

}  // namespace kiln::cli
