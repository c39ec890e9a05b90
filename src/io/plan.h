// Plan files: one versioned, mmap-able file per compiled model.
//
//   [0, 8)    magic "KILNPLAN"
//   [8, 12)   format version (u32 little endian)
//   [12, 16)  reserved, 0
//   [16, 24)  header length H (u64)
//   [24, 24+H) header JSON: build metadata (kiln version, git revision, device, precision,
//             profiles, source file hashes), the model config, prompt template, tokenizer
//             location, graphs (after passes) and the blob table
//   data section, starting at the next multiple of 64: the tokenizer bytes and every weight
//             blob, each at a 64-byte-aligned offset
//
// Reading maps the file and makes weight tensors views into the mapping (no copy). A plan of
// another format version or for another device is refused with a message saying what to do.
#pragma once

#include <string>

#include "core/logging.h"
#include "graph/model_ir.h"

namespace kiln {

inline constexpr uint32_t kPlanFormatVersion = 1;
inline constexpr char kPlanMagic[8] = {'K', 'I', 'L', 'N', 'P', 'L', 'A', 'N'};

struct PlanBuildInfo {
  std::string source;                     // HF directory or ONNX file it was built from
  std::vector<std::string> source_files;  // hashed into the metadata
  Device device = Device::kCpu;
  DType precision = DType::kF32;
};

void write_plan(const std::string& path, const ModelIR& model, const PlanBuildInfo& info,
                const Logger& log);
ModelIR read_plan(const std::string& path, const Logger& log);

// The header of a plan (metadata only; no graphs parsed), for `kiln inspect`.
std::string read_plan_metadata_json(const std::string& path);

}  // namespace kiln
