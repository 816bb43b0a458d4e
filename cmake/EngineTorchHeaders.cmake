# engine_hide_torch_protobuf_headers(), called after find_package(Torch) by the engine and by
# plugins built against the installed SDK (EngineConfig.cmake).
#
# torch's wheel carries the headers of the protobuf it was built with (include/google/protobuf,
# 3.13) in the directory every LibTorch header comes from; passed as -isystem, it comes before
# /usr/include, so the engine's generated .pb.h (Debian's protoc, 3.21) would compile against the
# wrong protobuf. The targets get a copy of that directory without google/ instead: a directory of
# links, in the build tree.

# engine_replace_item(LIST OLD NEW): every item of LIST equal to OLD becomes NEW.
function(engine_replace_item list old new)
  set(result)
  foreach(item IN LISTS ${list})
    if(item STREQUAL old)
      list(APPEND result "${new}")
    else()
      list(APPEND result "${item}")
    endif()
  endforeach()
  set(${list} "${result}" PARENT_SCOPE)
endfunction()

function(engine_hide_torch_protobuf_headers)
  set(torch_include "${TORCH_INSTALL_PREFIX}/include")
  if(NOT EXISTS "${torch_include}/google/protobuf")
    return()
  endif()
  set(shadow "${PROJECT_BINARY_DIR}/torch_include")
  file(REMOVE_RECURSE "${shadow}")
  file(MAKE_DIRECTORY "${shadow}")
  file(GLOB entries RELATIVE "${torch_include}" "${torch_include}/*")
  foreach(entry IN LISTS entries)
    if(NOT entry STREQUAL "google")
      file(CREATE_LINK "${torch_include}/${entry}" "${shadow}/${entry}" SYMBOLIC)
    endif()
  endforeach()
  foreach(target IN ITEMS c10 c10_cuda torch_cpu torch_cuda torch_nvshmem torch_cpu_library
                          torch_cuda_library torch torch_library)
    if(NOT TARGET ${target})
      continue()
    endif()
    get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
    if(dirs)
      engine_replace_item(dirs "${torch_include}" "${shadow}")
      set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${dirs}")
    endif()
  endforeach()
  engine_replace_item(TORCH_INCLUDE_DIRS "${torch_include}" "${shadow}")
  set(TORCH_INCLUDE_DIRS "${TORCH_INCLUDE_DIRS}" PARENT_SCOPE)
endfunction()
