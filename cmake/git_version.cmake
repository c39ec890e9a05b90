# Writes DST from the template SRC with the source tree's current git revision (suffixed
# "-dirty" when tracked files differ from it), at every build, rewriting DST only when the text
# changes: `kiln --version` names the commit that was built, not the one CMake last configured.
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE KILN_GIT_REV OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT KILN_GIT_REV)
  set(KILN_GIT_REV "unknown")
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY ${SOURCE_DIR}
                  RESULT_VARIABLE KILN_GIT_DIRTY ERROR_QUIET)
  if(NOT KILN_GIT_DIRTY EQUAL 0)
    string(APPEND KILN_GIT_REV "-dirty")
  endif()
endif()
configure_file(${SRC} ${DST} @ONLY)
