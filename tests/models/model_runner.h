// The parity tests drive a model's compiled graphs through runtime/forward.h.
#pragma once

#include <cstring>

#include "runtime/forward.h"
#include "runtime/kv_cache.h"

namespace kiln::test {

using ::kiln::Forward;
using ::kiln::ForwardModel;
using ::kiln::run_forward;

}  // namespace kiln::test
