# Checks the worker's layering by what its files include (run: cmake -DSOURCE_DIR=... -P).
#   - LibTorch (<torch/...>, <ATen/...>, <c10/...>) only in worker/data, worker/models and
#     worker/train: LibTorch's headers cost 20-30 s per file (STYLE.md "Build cost"), and
#     only those libraries link it.
#   - Gloo, NCCL and the CUDA runtime only in worker/comm, the one library that links them.
#   - Nothing in worker/ includes the coordinator (server/): worker tests and benchmarks link
#     joule::rendezvous_kv, never joule::server.
# Prints one line per offending include and fails; passes silently otherwise.
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "layering_test: pass -DSOURCE_DIR=<repository root>")
endif()
file(GLOB_RECURSE files RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/worker/*.h ${SOURCE_DIR}/worker/*.cc)
if(NOT files)
  message(FATAL_ERROR "layering_test: no worker sources under ${SOURCE_DIR}/worker")
endif()
set(errors 0)
foreach(f ${files})
  file(STRINGS ${SOURCE_DIR}/${f} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line ${includes})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]*)[>\"].*" "\\1" header "${line}")
    if(header MATCHES "^(torch|ATen|c10)/" AND NOT f MATCHES "^worker/(data|models|train)/")
      message("${f}: includes <${header}>: LibTorch belongs to worker/data, models, train")
      math(EXPR errors "${errors} + 1")
    endif()
    if(header MATCHES "^(gloo/|nccl\\.h|cuda_runtime|cuda\\.h)" AND NOT f MATCHES "^worker/comm/")
      message("${f}: includes <${header}>: Gloo, NCCL and CUDA belong to worker/comm")
      math(EXPR errors "${errors} + 1")
    endif()
    if(header MATCHES "^server/")
      message("${f}: includes \"${header}\": the worker does not depend on the coordinator")
      math(EXPR errors "${errors} + 1")
    endif()
  endforeach()
endforeach()
if(errors GREATER 0)
  message(FATAL_ERROR "layering_test: ${errors} include(s) break the worker's layering")
endif()
list(LENGTH files n)
message(STATUS "layering_test: ${n} worker files checked")
