// One option of a backend as `kiln bench -v` and `kiln inspect --device` print it.
#pragma once

#include <string>

namespace kiln {

struct BackendOption {
  std::string variable;  // the environment variable that sets it ("KILN_CUDA_GRAPHS")
  std::string value;     // the value in effect ("1")
  std::string meaning;   // what it sets, in a few words
};

}  // namespace kiln
