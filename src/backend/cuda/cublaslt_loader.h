// cuBLASLt is opened on first use (cublaslt_loader.cc), not linked: empty when it loaded,
// otherwise why not (the library is missing from the loader's path, or is not cuBLASLt).
#pragma once

#include <string>

namespace kiln::cuda {

std::string cublaslt_load_error();

}  // namespace kiln::cuda
