// What `kiln inspect --device` and `kiln bench -v` print about the devices: each backend's
// description and the options it runs with (its environment switches, read once).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace kiln::cli {

// One line an option: "  KILN_CUDA_GRAPHS=1  decode steps replayed from CUDA graphs".
std::string options_text(const std::vector<BackendOption>& options);
// {"KILN_CUDA_GRAPHS": "1", ...}
nlohmann::json options_json(const std::vector<BackendOption>& options);

// One device of this build and machine.
struct DeviceEntry {
  std::string device;   // "cpu", "cuda"
  std::string summary;  // the backend's description, the GPUs seen, or why there are none
  std::vector<BackendOption> options;
};
// The CPU's backend, and CUDA's GPUs with the options a CUDA backend made now would take (read
// with or without a GPU; none in a build without CUDA).
std::vector<DeviceEntry> device_report(Context& ctx);
// [{"device", "summary", "options": {...}}, ...]
nlohmann::json device_report_json(const std::vector<DeviceEntry>& report);
std::string device_report_text(const std::vector<DeviceEntry>& report);

}  // namespace kiln::cli
