# Checks that README.md shows the API examples exactly as they are in the
# files CI compiles and runs. A code block is tied to its file by a marker
# line just before it:
#   <!-- example: tests/consumer/example.c -->
#   ```c
#   ...the whole file...
#   ```
# Usage: cmake -DROOT=<source dir> -DEXAMPLES=<file>,<file>... -P readme_examples.cmake
# Fails naming the file when a block differs, or when a file in EXAMPLES
# has no marked block (every listed example must be shown).

# Sets ${block_var} to the code block marked for `example` in `readme`, or
# ${error_var} to why there is none.
function(marked_block readme example block_var error_var)
  set(${error_var} "" PARENT_SCOPE)
  set(marker "<!-- example: ${example} -->\n```")
  string(FIND "${readme}" "${marker}" at)
  if(at EQUAL -1)
    set(${error_var} "no fenced block after a line '<!-- example: ${example} -->'" PARENT_SCOPE)
    return()
  endif()
  string(SUBSTRING "${readme}" ${at} -1 rest)
  string(FIND "${rest}" "\n```" fence_end)     # the end of the marker line
  math(EXPR after_marker "${fence_end} + 1")
  string(SUBSTRING "${rest}" ${after_marker} -1 rest)
  string(FIND "${rest}" "\n" body_start)       # the end of the fence line ("```c")
  math(EXPR body_start "${body_start} + 1")
  string(SUBSTRING "${rest}" ${body_start} -1 rest)
  string(FIND "${rest}" "\n```\n" close)
  if(close EQUAL -1)
    set(${error_var} "the block for ${example} is not closed" PARENT_SCOPE)
    return()
  endif()
  math(EXPR body_length "${close} + 1")
  string(SUBSTRING "${rest}" 0 ${body_length} block)
  set(${block_var} "${block}" PARENT_SCOPE)
endfunction()

file(READ ${ROOT}/README.md readme)
string(REPLACE "," ";" examples "${EXAMPLES}")
set(failed FALSE)
foreach(example IN LISTS examples)
  marked_block("${readme}" ${example} block error)
  file(READ ${ROOT}/${example} source)
  if(NOT error STREQUAL "")
    message(SEND_ERROR "README.md: ${error}")
    set(failed TRUE)
  elseif(NOT block STREQUAL source)
    string(REPLACE "/" "_" flat "${example}")
    file(WRITE ${CMAKE_BINARY_DIR}/readme_block_${flat} "${block}")
    message(SEND_ERROR "README.md: the block for ${example} differs from the file "
                       "(the block is in ${CMAKE_BINARY_DIR}/readme_block_${flat}; diff it with the file)")
    set(failed TRUE)
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "README.md and the example files differ")
endif()
message(STATUS "README.md shows ${EXAMPLES} exactly")
