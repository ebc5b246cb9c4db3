# Checks the tree's layering by what its files include (run: cmake -DSOURCE_DIR=... -P).
#   - LibTorch (<torch/...>, <ATen/...>, <c10/...>) only in worker/data, worker/models and
#     worker/train: LibTorch's headers cost 20-30 s per file (STYLE.md "Build cost"), and
#     only those libraries link it.
#   - Gloo and NCCL only in worker/comm, the one library that links them; the CUDA runtime
#     only there and in worker/devices (a GPU's claim lists the devices' bus ids).
#   - Nothing in worker/ includes the coordinator (server/): worker tests and benchmarks link
#     joule::rendezvous_kv, never joule::server. Nor the CLI (client/).
#   - The coordinator (server/) includes nothing of the worker or the CLI: the three
#     programs meet in proto/ and common/.
#   - The CLI (client/) includes nothing of the coordinator, and of the worker only the
#     checkpoint file format (worker/train/checkpoint.h, joule::checkpoint_file, which
#     has no LibTorch), which `joule export` reads.
#   - common/ and proto/ include no program's folder.
#   - The worker's session with the coordinator (worker/agent/session.*) knows the attempt
#     only through worker/agent/attempt_control.h: nothing of worker/train or worker/comm,
#     nor the attempt runner or the agent.
# Prints one line per offending include and fails; passes silently otherwise.
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "layering_test: pass -DSOURCE_DIR=<repository root>")
endif()
file(GLOB_RECURSE files RELATIVE ${SOURCE_DIR}
     ${SOURCE_DIR}/worker/*.h ${SOURCE_DIR}/worker/*.cc ${SOURCE_DIR}/server/*.h
     ${SOURCE_DIR}/server/*.cc ${SOURCE_DIR}/client/*.h ${SOURCE_DIR}/client/*.cc
     ${SOURCE_DIR}/common/*.h ${SOURCE_DIR}/common/*.cc)
if(NOT files)
  message(FATAL_ERROR "layering_test: no sources under ${SOURCE_DIR}")
endif()
list(SORT files)
set(errors 0)
foreach(f ${files})
  file(STRINGS ${SOURCE_DIR}/${f} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line ${includes})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]*)[>\"].*" "\\1" header "${line}")
    set(why "")
    if(header MATCHES "^(torch|ATen|c10)/" AND NOT f MATCHES "^worker/(data|models|train)/")
      set(why "LibTorch belongs to worker/data, models, train")
    elseif(header MATCHES "^(gloo/|nccl\\.h)" AND NOT f MATCHES "^worker/comm/")
      set(why "Gloo and NCCL belong to worker/comm")
    elseif(header MATCHES "^(cuda_runtime|cuda\\.h)" AND NOT f MATCHES "^worker/(comm|devices)/")
      set(why "the CUDA runtime belongs to worker/comm and worker/devices")
    elseif(header MATCHES "^server/" AND NOT f MATCHES "^server/")
      set(why "only the coordinator includes the coordinator")
    elseif(header MATCHES "^client/" AND NOT f MATCHES "^client/")
      set(why "only the CLI includes the CLI")
    elseif(f MATCHES "^worker/agent/session\\." AND
           header MATCHES "^worker/(train/|comm/|agent/(attempt_runner|agent)\\.h)")
      set(why "the session knows the attempt only through worker/agent/attempt_control.h")
    elseif(header MATCHES "^worker/" AND NOT f MATCHES "^worker/" AND
           NOT (f MATCHES "^client/" AND header STREQUAL "worker/train/checkpoint.h"))
      set(why "outside worker/, only the CLI includes the worker, and only its checkpoint format")
    endif()
    if(why)
      message("${f}: includes <${header}>: ${why}")
      math(EXPR errors "${errors} + 1")
    endif()
  endforeach()
endforeach()
if(errors GREATER 0)
  message(FATAL_ERROR "layering_test: ${errors} include(s) break the layering")
endif()
list(LENGTH files n)
message(STATUS "layering_test: ${n} files checked")
