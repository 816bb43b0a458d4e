# Run by cmake -P after a test binary links (cmake/EngineTestSuites.cmake): lists its GoogleTest
# suites and writes SUITES_FILE, the ctest script that adds one test per suite (per suite and
# parameter for a value-parameterized suite, "Prefix/Suite/parameter"). Inputs (-D): TEST_EXECUTABLE,
# SUITES_FILE, LONG_SUITES and LABELS (comma-separated), TIMEOUT.
#
# A binary that cannot list its tests fails the build, naming it: a test that does not start would
# otherwise be missing from ctest without a word.
cmake_minimum_required(VERSION 3.18)
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
  OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE status TIMEOUT 120)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${status}):\n${errors}")
endif()
string(REPLACE "," ";" long_suites "${LONG_SUITES}")
string(REPLACE "," ";" labels "${LABELS}")

set(keys "")
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([^ ]+)" AND DEFINED suite)
    set(test "${CMAKE_MATCH_1}")
    if(test MATCHES "^DISABLED_" OR suite MATCHES "(^|/)DISABLED_")
      continue()
    endif()
    if(test MATCHES "/([^/]+)$")
      set(key "${suite}/${CMAKE_MATCH_1}")
      set(filter_${key} "${suite}.*/${CMAKE_MATCH_1}")
    else()
      set(key "${suite}")
      set(filter_${key} "${suite}.*")
    endif()
    if(NOT key IN_LIST keys)
      list(APPEND keys "${key}")
    endif()
  endif()
endforeach()

set(script "# Generated from ${TEST_EXECUTABLE} --gtest_list_tests by cmake/list_test_suites.cmake\n")
foreach(key IN LISTS keys)
  # The binaries' main (tests/testing/gtest_main.cc) exits 77 when every test of the filter
  # skipped itself (GTEST_SKIP: no GPU here) and none failed; ctest then says Skipped.
  string(CONCAT properties "ENVIRONMENT [==[ENGINE_PLUGIN_PATH=]==] TIMEOUT ${TIMEOUT}"
    " SKIP_RETURN_CODE 77")
  if(key IN_LIST long_suites)
    # ctest starts the longest tests first when it has no timings of its own (a fresh clone).
    string(APPEND properties " COST 100")
  endif()
  if(labels)
    string(APPEND properties " LABELS [==[${labels}]==]")
  endif()
  string(APPEND script "add_test([==[${key}]==] [==[${TEST_EXECUTABLE}]==] "
    "[==[--gtest_filter=${filter_${key}}]==])\n"
    "set_tests_properties([==[${key}]==] PROPERTIES ${properties})\n")
endforeach()
file(WRITE "${SUITES_FILE}.part" "${script}")
file(RENAME "${SUITES_FILE}.part" "${SUITES_FILE}")
