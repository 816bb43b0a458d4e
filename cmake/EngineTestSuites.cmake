# engine_add_test_suites(target [LONG suite...] [LABELS label...]): ctest runs the GoogleTest binary
# `target` one process per suite ("Suite", or "Prefix/Suite/parameter" for each parameter of a
# value-parameterized suite), each with a --gtest_filter; the suite's output names every failing
# test. One process per test (gtest_discover_tests) started LibTorch about 600 times, a second each,
# half the time of the tests that finish in seconds.
#
# The suites are listed when the binary links (cmake/list_test_suites.cmake), so a new test is run
# without a change here. LONG names suites that take minutes: ctest starts them first on a clone
# that has no timings of its own yet, so the run does not end waiting for one of them.
set(ENGINE_LIST_TEST_SUITES ${CMAKE_CURRENT_LIST_DIR}/list_test_suites.cmake)
function(engine_add_test_suites target)
  cmake_parse_arguments(ARG "" "" "LONG;LABELS" ${ARGN})
  set(suites_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake)
  string(REPLACE ";" "," long "${ARG_LONG}")
  string(REPLACE ";" "," labels "${ARG_LABELS}")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D TEST_EXECUTABLE=$<TARGET_FILE:${target}>
      -D SUITES_FILE=${suites_file} -D LONG_SUITES=${long} -D LABELS=${labels} -D TIMEOUT=1200
      -P ${ENGINE_LIST_TEST_SUITES}
    BYPRODUCTS ${suites_file}
    COMMENT "Listing the test suites of ${target}"
    VERBATIM)
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake)
  file(WRITE ${include_file}
    "if(EXISTS [==[${suites_file}]==])\n"
    "  include([==[${suites_file}]==])\n"
    "else()\n"
    "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
