// The reference backend: every op written plainly from its definition (HuggingFace's semantics),
// in double precision, one element at a time. It is the oracle the op tests compare every other
// backend against, and it runs whole models (slowly) for parity checks. It shares nothing with
// the fast kernels: not their code, not their dtype conversions.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace kiln {

std::unique_ptr<Backend> make_reference_backend(Context& ctx);

}  // namespace kiln
