// Plan files: one versioned, mmap-able file per compiled model (format version 3).
//
//   [0, 8)    magic "KILNPLAN"
//   [8, 12)   format version (u32 little endian)
//   [12, 16)  reserved, 0
//   [16, 24)  header length H (u64)
//   [24, 32)  checksum (u64): hash64 of the header JSON followed by the tokenizer bytes
//   [32, 32+H) header JSON: build metadata (kiln version, git revision, device, precision,
//             shape profile, source file hashes), the model description, the source config,
//             prompt template, tokenizer (format, location, piece count), graphs (after passes)
//             and the blob table
//   data section, starting at the next multiple of 64: the tokenizer bytes and every weight
//             blob (plain or packed, each with its layout and content hash), each at a
//             64-byte-aligned offset
//
// Reading maps the file and makes weight tensors views into the mapping (no copy). The header
// and tokenizer are checked against the checksum on every load; weights are hashed only by
// verify_plan_weights (`kiln inspect --verify`), since hashing gigabytes would defeat mmap. A
// plan of another format version or for a device this build cannot run is refused with a
// message saying what to do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/logging.h"
#include "graph/model_ir.h"

namespace kiln {

// 3: the tokenizer's piece count in the header (a tokenizer whose bytes were cut behind the
// checksum is refused instead of running with fewer pieces).
inline constexpr uint32_t kPlanFormatVersion = 3;
inline constexpr char kPlanMagic[8] = {'K', 'I', 'L', 'N', 'P', 'L', 'A', 'N'};
inline constexpr size_t kPlanFixedHeader = 32;

struct PlanBuildInfo {
  std::string source;                     // HF directory or ONNX file it was built from
  std::vector<std::string> source_files;  // hashed into the metadata
};

// Writes atomically (a temporary file renamed into place); the temporary file is removed on
// any failure.
void write_plan(const std::string& path, const ModelIR& model, const PlanBuildInfo& info,
                const Logger& log);
ModelIR read_plan(const std::string& path, const Logger& log);

// The header of a plan (metadata only; no graphs or blobs), for `kiln inspect`.
std::string read_plan_metadata_json(const std::string& path);

// Hashes every weight blob and compares with the hashes recorded at build time. Returns one
// line per mismatching blob (empty: every weight is intact).
std::vector<std::string> verify_plan_weights(const std::string& path);

}  // namespace kiln
