// Internal to the ONNX reader (src/io/onnx): TensorProto → OnnxTensor, with the checks on its
// data (typed fields, raw_data, external data files inside the model's folder).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "io/mmap_file.h"
#include "io/onnx/onnx_model.h"
#include "onnx.pb.h"

namespace kiln::onnx_detail {

// External data files of one model, each mapped once however many tensors it holds.
struct ExternalData {
  std::string model_path;
  std::filesystem::path model_dir;
  std::map<std::string, std::shared_ptr<MappedFile>> files;  // by canonical path
};

// `what` says where the tensor is for messages ("initializer 'w'", "node 'Constant_3'
// attribute 'value'").
OnnxTensor decode_onnx_tensor(const onnx::TensorProto& proto, ExternalData& external,
                              const std::string& what);

}  // namespace kiln::onnx_detail
