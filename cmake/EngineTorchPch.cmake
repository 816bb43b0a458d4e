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
  add_library(engine_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  target_link_libraries(engine_torch_pch PRIVATE torch engine_warnings)
  target_precompile_headers(engine_torch_pch PRIVATE <ATen/ATen.h> <torch/nn/module.h> <string>
    <vector> <map> <memory>)
endif()

# engine_use_torch_pch(target...): the targets compile with engine_torch_pch's header.
function(engine_use_torch_pch)
  if(ENGINE_USE_PCH)
    foreach(target IN LISTS ARGN)
      target_precompile_headers(${target} REUSE_FROM engine_torch_pch)
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
