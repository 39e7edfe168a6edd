#include "allocator/sim_device.h"
#include "gtest/gtest.h"
TEST(Placeholder, Builds) {}
