# Precompiled headers. LibTorch's headers take 12-20 s to parse in every translation unit
# that includes them (about twenty here); parsed once into one precompiled <torch/torch.h>
# they load in about a second. Every target that parses LibTorch reuses that one header
# (REUSE_FROM needs the same compiler flags, which every target here has: see the
# top-level CMakeLists.txt). GCC falls back to the text header, with a -Winvalid-pch
# warning, where a precompiled header does not fit (a define LibTorch reads that differs,
# say), so this changes build time only; that warning stays a warning under JOULE_WERROR.
# Turn it off with -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON (e.g. for include-what-you-use).
add_library(joule_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
target_link_libraries(joule_torch_pch PRIVATE ${TORCH_LIBRARIES})
# -pthread defines _REENTRANT, and the targets reusing the header get it from Abseil, gRPC
# and GoogleTest; a header built without it would be refused.
target_compile_options(joule_torch_pch PRIVATE -pthread)
target_precompile_headers(joule_torch_pch PRIVATE <torch/torch.h>)

# joule_use_torch_pch(TARGET t SOURCES a.cc b.cc): compile the listed sources of t, those
# that parse LibTorch, with the precompiled header; t's other sources stay as they are, so
# LibTorch is not forced into files that do not include it.
function(joule_use_torch_pch)
  cmake_parse_arguments(ARG "" "TARGET" "SOURCES" ${ARGN})
  target_precompile_headers(${ARG_TARGET} REUSE_FROM joule_torch_pch)
  target_compile_options(${ARG_TARGET} PRIVATE -Wno-error=invalid-pch)
  get_target_property(sources ${ARG_TARGET} SOURCES)
  foreach(source IN LISTS sources)
    if(NOT source IN_LIST ARG_SOURCES)
      set_source_files_properties(${source} TARGET_DIRECTORY ${ARG_TARGET}
                                  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
endfunction()
