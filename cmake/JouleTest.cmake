# joule_add_test(NAME SOURCES a.cc b.cc LIBS x y LABELS unit [TIMEOUT s] [TORCH])
# Builds one GoogleTest executable and registers it with CTest under the given labels.
# TORCH: the test parses LibTorch; compile it with the precompiled header (JoulePch.cmake).
# Included from tests/CMakeLists.txt only, so GoogleTest is needed only with
# JOULE_BUILD_TESTS=ON.
find_package(GTest CONFIG QUIET)
if(NOT GTest_FOUND)
  find_package(GTest REQUIRED)
endif()

# A GoogleTest executable of `sources` linking `libs`; with `torch` true, compiled with
# the precompiled <torch/torch.h> (cmake/JoulePch.cmake).
function(_joule_test_executable name torch sources libs)
  add_executable(${name} ${sources})
  target_link_libraries(${name} PRIVATE ${libs} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  if(torch)
    target_precompile_headers(${name} REUSE_FROM joule_torch_pch)
    target_compile_options(${name} PRIVATE -Wno-error=invalid-pch)
  endif()
endfunction()

function(joule_add_test name)
  cmake_parse_arguments(ARG "TORCH" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  _joule_test_executable(${name} "${ARG_TORCH}" "${ARG_SOURCES}" "${ARG_LIBS}")
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# joule_add_test_group(NAME SOURCES a_test.cc b_test.cc [SUPPORT x.cc] LIBS x y
#                      LABELS unit [TORCH])
# Several test files of one folder as one GoogleTest executable NAME, compiled in unity
# batches with JOULE_UNITY_BUILD (headers such as gRPC's, or LibTorch's templates, are then
# parsed and instantiated once per batch, not once per file), and still one ctest entry per
# file, named after it (tests/server/job_store_test.cc -> server_job_store_test), that runs
# only that file's cases: --gtest_filter over the suites its TEST/TEST_F/TEST_P/TYPED_TEST
# lines name (at the start of a line); an entry that runs no case fails.
# A suite named in two files of a group fails the configure step, so no case runs twice or
# is missed; CMake re-reads the files when they change. SUPPORT: helper sources linked in,
# not tests. File-local names must differ between the files of a group (a unity batch is
# one translation unit).
# Per-file settings go on the entry afterwards (set_tests_properties(<entry> ...)).
function(joule_add_test_group name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;SUPPORT;LIBS;LABELS" ${ARGN})
  _joule_test_executable(${name} "${ARG_TORCH}" "${ARG_SOURCES};${ARG_SUPPORT}" "${ARG_LIBS}")
  set_target_properties(${name} PROPERTIES UNITY_BUILD ${JOULE_UNITY_BUILD})
  set(seen_suites "")
  foreach(source IN LISTS ARG_SOURCES)
    set(path ${CMAKE_CURRENT_SOURCE_DIR}/${source})
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})
    file(STRINGS ${path} lines REGEX "^(TYPED_)?TEST(_F|_P)?\\([A-Za-z0-9_]+,")
    set(suites "")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^(TYPED_)?TEST(_F|_P)?\\(([A-Za-z0-9_]+),.*" "\\3" suite "${line}")
      list(APPEND suites ${suite})
    endforeach()
    list(REMOVE_DUPLICATES suites)
    if(NOT suites)
      message(FATAL_ERROR "joule_add_test_group(${name}): ${source} has no TEST line")
    endif()
    set(filter "")
    foreach(suite IN LISTS suites)
      if(suite IN_LIST seen_suites)
        message(FATAL_ERROR "joule_add_test_group(${name}): suite ${suite} is named in two "
                            "files; ${source} needs suites of its own")
      endif()
      list(APPEND seen_suites ${suite})
      # TEST_P cases run as Prefix/Suite.Case/Param, typed ones as Suite/N.Case.
      string(APPEND filter "${suite}.*:*/${suite}.*:${suite}/*:")
    endforeach()
    string(REGEX REPLACE "\\.cc$" "" entry "${source}")
    string(REPLACE "/" "_" entry "${entry}")
    add_test(NAME ${entry} COMMAND ${name} --gtest_filter=${filter})
    # A filter that matches nothing (a suite renamed under #if, say) fails, not passes.
    set_tests_properties(${entry} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 120
                         FAIL_REGULAR_EXPRESSION "Running 0 tests")
  endforeach()
endfunction()
