# SPDX-License-Identifier: Apache-2.0
# Keeps README.md and docs/*.md reference pages: they state current behaviour
# and current figures; dated runs, issue numbers and the history of a change
# live in docs/measurements.md, the one page this check skips, and a reference
# page points there ("docs/measurements.md, SECTION").
# Usage: cmake -DROOT=<source dir> -P docs_reference.cmake
# Fails with one line per finding: `PAGE:LINE: what (the text found)`.
cmake_minimum_required(VERSION 3.25)

# What a reference page must not hold, as "regex|what"; matched against the
# page in lower case.
set(rules
  "(19|20)[0-9][0-9]-[01][0-9]-[0-3][0-9]|a date"
  "issue #?[0-9]+|an issue number"
  "before the fix|history of a change"
  "of this change|history of a change"
  "earlier run|an earlier run")

file(GLOB pages RELATIVE ${ROOT} ${ROOT}/docs/*.md)
list(REMOVE_ITEM pages docs/measurements.md)
list(PREPEND pages README.md)
set(findings 0)
foreach(page IN LISTS pages)
  file(READ ${ROOT}/${page} text)
  string(TOLOWER "${text}" text)
  foreach(rule IN LISTS rules)
    string(FIND "${rule}" "|" bar REVERSE)
    string(SUBSTRING "${rule}" 0 ${bar} regex)
    math(EXPR after "${bar} + 1")
    string(SUBSTRING "${rule}" ${after} -1 what)
    # Each match in turn, with the line it is on.
    set(rest "${text}")
    set(line 1)
    string(REGEX MATCH "${regex}" hit "${rest}")
    while(NOT hit STREQUAL "")
      string(FIND "${rest}" "${hit}" at)
      string(SUBSTRING "${rest}" 0 ${at} before)
      string(REGEX MATCHALL "\n" newlines "${before}")
      list(LENGTH newlines count)
      math(EXPR line "${line} + ${count}")
      message(SEND_ERROR "${page}:${line}: ${what} (${hit})")
      math(EXPR findings "${findings} + 1")
      string(LENGTH "${hit}" length)
      math(EXPR next "${at} + ${length}")
      string(SUBSTRING "${rest}" ${next} -1 rest)
      string(REGEX MATCH "${regex}" hit "${rest}")
    endwhile()
  endforeach()
endforeach()
list(LENGTH pages page_count)
if(findings GREATER 0)
  message(FATAL_ERROR "${findings} dated or historical passages in the reference pages: move each "
                      "run, with its date, command, machine and figures, to docs/measurements.md "
                      "and leave the current figure with a pointer there")
endif()
message(STATUS "${page_count} reference pages, no dates, issue numbers or history (docs/measurements.md holds them)")
