# Configures the project in scratch build directories and checks the options' contracts
# (run: cmake -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -P):
#   - without tests, GoogleTest is not needed (configuring succeeds with it hidden);
#   - with tests, it is (configuring fails with it hidden);
#   - JOULE_WITH_CUDA is auto-detected: OFF without a CUDA toolkit;
#   - -DJOULE_WITH_CUDA=ON without a CUDA toolkit fails, saying so.
foreach(v SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT ${v})
    message(FATAL_ERROR "configure_test: pass -D${v}=...")
  endif()
endforeach()

# configure(NAME EXPECT_OK|EXPECT_FAIL REGEX args...): configures into WORK_DIR/NAME.
function(configure name expect regex)
  file(REMOVE_RECURSE ${WORK_DIR}/${name})
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/${name} -G ${GENERATOR}
            -DJOULE_BUILD_BENCH=OFF ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(all "${out}${err}")
  if(expect STREQUAL "EXPECT_OK" AND NOT rc EQUAL 0)
    message(FATAL_ERROR "configure_test ${name}: configuring failed:\n${all}")
  endif()
  if(expect STREQUAL "EXPECT_FAIL" AND rc EQUAL 0)
    message(FATAL_ERROR "configure_test ${name}: configuring succeeded, should have failed")
  endif()
  if(NOT all MATCHES "${regex}")
    message(FATAL_ERROR "configure_test ${name}: output lacks '${regex}':\n${all}")
  endif()
  file(REMOVE_RECURSE ${WORK_DIR}/${name})
  message(STATUS "configure_test ${name}: ok")
endfunction()

configure(no_tests_no_gtest EXPECT_OK "Joule: JOULE_WITH_CUDA OFF"
          -DJOULE_BUILD_TESTS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
configure(tests_need_gtest EXPECT_FAIL "GTest"
          -DJOULE_BUILD_TESTS=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
configure(cuda_on_without_toolkit EXPECT_FAIL
          "JOULE_WITH_CUDA=ON, but CMake found no CUDA toolkit with NCCL"
          -DJOULE_BUILD_TESTS=OFF -DJOULE_WITH_CUDA=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
