#include "core/allocator.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace engine {
namespace {

TEST(AllocatorTest, AppliesUnlessTheEnvironmentOptsOut) {
  ::setenv("ENGINE_DEFAULT_MALLOC", "1", 1);
  EXPECT_FALSE(ConfigureAllocatorForTraining());
  ::setenv("ENGINE_DEFAULT_MALLOC", "0", 1);
  EXPECT_TRUE(ConfigureAllocatorForTraining());
  ::unsetenv("ENGINE_DEFAULT_MALLOC");
  EXPECT_TRUE(ConfigureAllocatorForTraining());
}

}  // namespace
}  // namespace engine
