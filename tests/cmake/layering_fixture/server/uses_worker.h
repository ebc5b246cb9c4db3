// Fixture for cmake_layering_fixture_test: must be reported.
#include "worker/agent/agent.h"
