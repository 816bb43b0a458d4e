# One precompiled header of LibTorch's heaviest headers, compiled once and reused by the targets
# whose sources are mostly LibTorch modules and ops (the command, the transformer library, the
# built-in plugins, the tests). <ATen/ATen.h> and <torch/nn/module.h> take 15 and 22 s to parse on
# the 2-core project machine, most of a 30 s translation unit; with this header such a unit takes
# about 15 s. Targets whose sources are mostly light (libengine's) keep their own smaller header:
# loading this one costs every unit a few seconds.
#
# GCC uses a precompiled header only where the macros it was made with are defined the same way, so
# the header is made with no definitions but LibTorch's; -Winvalid-pch (which CMake adds) names a
# unit that cannot use it, and that unit then parses the headers itself.
if(ENGINE_USE_PCH)
  set(ENGINE_TORCH_PCH_HEADERS <ATen/ATen.h> <torch/nn/module.h> <string> <vector> <map> <memory>)
  add_library(engine_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  target_link_libraries(engine_torch_pch PRIVATE torch engine_warnings)
  target_precompile_headers(engine_torch_pch PRIVATE ${ENGINE_TORCH_PCH_HEADERS})
  # Plugins export only their entry points (cmake/EnginePlugin.cmake). GCC takes a header made
  # with default visibility there without a word, and LibTorch's inline functions would then be
  # exported from every plugin that reuses it: plugins get a header made with their visibility.
  add_library(engine_torch_pch_hidden OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  target_link_libraries(engine_torch_pch_hidden PRIVATE torch engine_warnings)
  set_target_properties(engine_torch_pch_hidden PROPERTIES CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_precompile_headers(engine_torch_pch_hidden PRIVATE ${ENGINE_TORCH_PCH_HEADERS})
endif()

# engine_use_torch_pch(target...): the targets compile with engine_torch_pch's header (its hidden-
# visibility twin for targets whose symbols are hidden).
function(engine_use_torch_pch)
  if(ENGINE_USE_PCH)
    foreach(target IN LISTS ARGN)
      get_target_property(visibility ${target} CXX_VISIBILITY_PRESET)
      if(visibility STREQUAL "hidden")
        target_precompile_headers(${target} REUSE_FROM engine_torch_pch_hidden)
      else()
        target_precompile_headers(${target} REUSE_FROM engine_torch_pch)
      endif()
      # GCC refuses a header made with -fPIC in a unit compiled with -fPIE (an executable's); PIC
      # objects link into a PIE executable all the same.
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "EXECUTABLE")
        set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
        target_compile_options(${target} PRIVATE -fPIC)
      endif()
    endforeach()
  endif()
endfunction()
