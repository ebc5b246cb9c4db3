# joule_add_test(NAME SOURCES a.cc b.cc LIBS x y LABELS unit [TIMEOUT s] [TORCH])
# Builds one GoogleTest executable and registers it with CTest under the given labels.
# TORCH: the test parses LibTorch; compile it with the precompiled header (JoulePch.cmake).
# Included from tests/CMakeLists.txt only, so GoogleTest is needed only with
# JOULE_BUILD_TESTS=ON.
find_package(GTest CONFIG QUIET)
if(NOT GTest_FOUND)
  find_package(GTest REQUIRED)
endif()

function(joule_add_test name)
  cmake_parse_arguments(ARG "TORCH" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  if(ARG_TORCH)
    target_precompile_headers(${name} REUSE_FROM joule_torch_pch)
    target_compile_options(${name} PRIVATE -Wno-error=invalid-pch)  # cmake/JoulePch.cmake
  endif()
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()
