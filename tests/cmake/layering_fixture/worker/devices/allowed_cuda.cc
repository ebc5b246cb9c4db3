// Fixture for cmake_layering_fixture_test: allowed, must not be reported.
#include <cuda_runtime_api.h>
