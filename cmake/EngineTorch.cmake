# Which LibTorch the engine builds against: the one inside ENGINE_PYTHON's environment, at the
# version requirements.in pins (the version is written only there).
#
# Included before find_package(Torch): points CMAKE_PREFIX_PATH at that torch unless the caller
# gave a Torch_DIR, and keeps torch's CMake files from probing for a GPU (none here) by naming the
# architectures the CUDA kernels are compiled for. engine_adopt_torch(), called after
# find_package(Torch), refuses another version and hides the protobuf headers the wheel carries.

# (Its tests set ENGINE_TORCH_PINNED_VERSION to see another version refused.)
if(NOT ENGINE_TORCH_PINNED_VERSION)
  file(STRINGS "${PROJECT_SOURCE_DIR}/requirements.in" ENGINE_TORCH_PIN REGEX "^torch==")
  string(REGEX REPLACE "^torch==([^ ;#]+).*" "\\1" ENGINE_TORCH_PINNED_VERSION
    "${ENGINE_TORCH_PIN}")
endif()

if(NOT Torch_DIR)
  if(NOT EXISTS "${ENGINE_PYTHON}")
    message(FATAL_ERROR "engine: no Python environment at ${ENGINE_PYTHON}: run scripts/setup.sh "
      "build (it makes .venv from requirements.txt), or pass -DENGINE_PYTHON=/path/to/bin/python "
      "of an environment with torch==${ENGINE_TORCH_PINNED_VERSION}")
  endif()
  execute_process(
    COMMAND "${ENGINE_PYTHON}" -c
      "import importlib.util as u, os; s = u.find_spec('torch'); print(os.path.join(os.path.dirname(s.origin), 'share', 'cmake') if s else '')"
    OUTPUT_VARIABLE ENGINE_TORCH_CMAKE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE ENGINE_PYTHON_RESULT)
  if(NOT ENGINE_PYTHON_RESULT EQUAL 0 OR NOT ENGINE_TORCH_CMAKE_DIR
     OR NOT EXISTS "${ENGINE_TORCH_CMAKE_DIR}/Torch/TorchConfig.cmake")
    message(FATAL_ERROR "engine: ${ENGINE_PYTHON} has no torch (or a half-installed one: no "
      "Torch/TorchConfig.cmake): run scripts/setup.sh build to install requirements.txt")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${ENGINE_TORCH_CMAKE_DIR}")
endif()

# Torch's CUDA set-up otherwise asks the (absent) GPU, then builds for a dozen architectures. The
# GPUs users train on: A100 (8.0) and H100/H200 (9.0).
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/EngineTorchHeaders.cmake)

function(engine_check_torch_version)
  if(Torch_VERSION VERSION_EQUAL ENGINE_TORCH_PINNED_VERSION)
    return()
  endif()
  set(message "engine: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}) is not the pinned "
    "torch==${ENGINE_TORCH_PINNED_VERSION} (requirements.in)")
  if(ENGINE_ANY_TORCH)
    message(WARNING ${message} "; building anyway (ENGINE_ANY_TORCH), untested")
  else()
    message(FATAL_ERROR ${message} ": run scripts/setup.sh build, or pass -DENGINE_ANY_TORCH=ON "
      "to build against it untested")
  endif()
endfunction()

macro(engine_adopt_torch)
  engine_check_torch_version()
  engine_hide_torch_protobuf_headers()
  # Installed libraries and the engine name it in their RUNPATH: CMAKE_INSTALL_RPATH_USE_LINK_PATH
  # skips it when .venv lies inside the checkout, and RUNPATH does not reach a library's own
  # dependencies, so each library that links LibTorch must find it itself.
  set(ENGINE_TORCH_LIBRARY_DIR "${TORCH_INSTALL_PREFIX}/lib")
endmacro()
