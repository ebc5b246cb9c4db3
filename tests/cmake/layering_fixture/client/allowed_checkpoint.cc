// Fixture for cmake_layering_fixture_test: allowed, must not be reported.
#include "worker/train/checkpoint.h"
