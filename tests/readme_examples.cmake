# SPDX-License-Identifier: Apache-2.0
# Checks that the documented API examples are the files CI compiles and
# runs. docs/api.md shows each file whole, README.md an excerpt of it; a code
# block is tied to its file by a marker line just before it:
#   <!-- example: tests/consumer/example.c -->     (docs/api.md: the whole file)
#   <!-- excerpt: tests/consumer/example.c -->     (README.md: whole lines of it)
#   ```c
#   ...
#   ```
# Usage: cmake -DROOT=<source dir> -DEXAMPLES=<file>,<file>... -P readme_examples.cmake
# Fails naming the file when docs/api.md's block differs from it, when the
# README's excerpt is not a run of its lines, or when a file in EXAMPLES has
# no marked block in either document (every listed example must be shown).

# Sets ${block_var} to the code block marked `<!-- kind: example -->` in
# `doc`, or ${error_var} to why there is none.
function(marked_block doc kind example block_var error_var)
  set(${error_var} "" PARENT_SCOPE)
  set(marker "<!-- ${kind}: ${example} -->\n```")
  string(FIND "${doc}" "${marker}" at)
  if(at EQUAL -1)
    set(${error_var} "no fenced block after a line '<!-- ${kind}: ${example} -->'" PARENT_SCOPE)
    return()
  endif()
  string(SUBSTRING "${doc}" ${at} -1 rest)
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

# Writes `block` next to the build for diffing and reports that it differs.
function(report_block doc example block what)
  string(REPLACE "/" "_" flat "${doc}_${example}")
  file(WRITE ${CMAKE_BINARY_DIR}/doc_block_${flat} "${block}")
  message(SEND_ERROR "${doc}: the block for ${example} ${what} "
                     "(the block is in ${CMAKE_BINARY_DIR}/doc_block_${flat}; diff it with the file)")
endfunction()

file(READ ${ROOT}/docs/api.md guide)
file(READ ${ROOT}/README.md readme)
string(REPLACE "," ";" examples "${EXAMPLES}")
set(failed FALSE)
foreach(example IN LISTS examples)
  file(READ ${ROOT}/${example} source)
  marked_block("${guide}" example ${example} block error)
  if(NOT error STREQUAL "")
    message(SEND_ERROR "docs/api.md: ${error}")
    set(failed TRUE)
  elseif(NOT block STREQUAL source)
    report_block(docs/api.md ${example} "${block}" "differs from the file")
    set(failed TRUE)
  endif()
  marked_block("${readme}" excerpt ${example} block error)
  if(NOT error STREQUAL "")
    message(SEND_ERROR "README.md: ${error}")
    set(failed TRUE)
  else()
    # Whole lines: the excerpt starts at a line start of the file.
    string(FIND "\n${source}" "\n${block}" at)
    if(block STREQUAL "" OR at EQUAL -1)
      report_block(README.md ${example} "${block}" "is not a run of whole lines of the file")
      set(failed TRUE)
    endif()
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "the documented examples and the example files differ")
endif()
message(STATUS "docs/api.md shows ${EXAMPLES} exactly, README.md excerpts of them")
