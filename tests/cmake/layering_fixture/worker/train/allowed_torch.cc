// Fixture for cmake_layering_fixture_test: allowed, must not be reported.
#include <torch/torch.h>
#include <ATen/ATen.h>
