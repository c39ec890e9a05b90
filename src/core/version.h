// kiln's version and the git revision it was built from. Defined in a generated file so that a
// new commit recompiles one file, not the whole tree.
#pragma once

namespace kiln {

const char* version_string();
const char* git_revision();

}  // namespace kiln
