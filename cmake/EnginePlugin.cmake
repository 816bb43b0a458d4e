# engine_add_plugin: builds one engine plugin as a loadable module.
#
#   engine_add_plugin(my_loader
#     SOURCES my_loader.cc
#     PROTOS my_loader_options.proto)       # compiled into this library only
#
# The result is <name>.so named "engine_<name>.so", with hidden symbols except the two entry points that
# ENGINE_PLUGIN defines. Put it in a directory on the engine's plugin path (--plugin_path or
# $ENGINE_PLUGIN_PATH). Options protos may `import "engine/options.proto"`.
#
# Inside the engine's own tree ENGINE_PLUGIN_LINK_TARGET is engine_core; an installed SDK sets it to
# Engine::engine.
function(engine_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIRECTORY" "SOURCES;PROTOS" ${ARGN})
  set(target engine_plugin_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(ARG_PROTOS)
    protobuf_generate(TARGET ${target} LANGUAGE cpp PROTOS ${ARG_PROTOS}
      IMPORT_DIRS ${CMAKE_CURRENT_SOURCE_DIR} ${ENGINE_PROTO_IMPORT_DIRS}
      PROTOC_OUT_DIR ${CMAKE_CURRENT_BINARY_DIR} OUT_VAR generated)
    # protoc's files each define the same file-local tables: never in a unity batch together.
    set_source_files_properties(${generated} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_BINARY_DIR})
  endif()
  target_link_libraries(${target} PRIVATE ${ENGINE_PLUGIN_LINK_TARGET})
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
  if(NOT ARG_OUTPUT_DIRECTORY)
    set(ARG_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME engine_${name}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY}
    INSTALL_RPATH "$ORIGIN/../..")
endfunction()

# engine_add_conformance_test: a GoogleTest binary (registered with CTest) that runs the conformance
# suite on a plugin built with engine_add_plugin.
#
#   engine_add_conformance_test(my_loader [OPTIONS ${CMAKE_CURRENT_SOURCE_DIR}/options.pbtxt])
#
# Needs GoogleTest and the engine's conformance library (Engine::conformance once installed).
function(engine_add_conformance_test name)
  cmake_parse_arguments(ARG "" "OPTIONS" "" ${ARGN})
  set(plugin engine_plugin_${name})
  set(source ${CMAKE_CURRENT_BINARY_DIR}/${name}_conformance_test.cc)
  file(GENERATE OUTPUT ${source} CONTENT
"#include \"engine/conformance_gtest.h\"
using engine::conformance::PluginConformanceTest;
INSTANTIATE_TEST_SUITE_P(${name}, PluginConformanceTest,
    ::testing::Values(engine::conformance::Target{\"$<TARGET_FILE:${plugin}>\", \"${ARG_OPTIONS}\"}));
")
  add_executable(${name}_conformance_test ${source})
  if(TARGET Engine::conformance)
    target_link_libraries(${name}_conformance_test PRIVATE Engine::conformance GTest::gtest_main)
  else()
    target_link_libraries(${name}_conformance_test PRIVATE engine_conformance GTest::gtest_main)
  endif()
  add_dependencies(${name}_conformance_test ${plugin})
  include(GoogleTest)
  gtest_discover_tests(${name}_conformance_test DISCOVERY_TIMEOUT 120)
endfunction()
