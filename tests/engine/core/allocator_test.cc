#include "core/allocator.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <stdlib.h>

#include <cstdlib>

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

// mallinfo2's hblks counts the blocks that came from mmap.
size_t MmappedBlocksAfterAllocating(size_t bytes) {
  void* block = std::malloc(bytes);
  // The block escapes, or the compiler drops a malloc whose block is only freed.
  asm volatile("" : : "r"(block) : "memory");
  const size_t mmapped = mallinfo2().hblks;
  std::free(block);
  return mmapped;
}

TEST(AllocatorTest, LargeBlocksComeFromMmapOnlyWhileTheScopeLives) {
  ASSERT_TRUE(ConfigureAllocatorForTraining());
  const size_t before = mallinfo2().hblks;
  // The training settings keep blocks up to 32 MB in the heap. A block the heap can serve from
  // memory it holds (the 10 MB freed here) comes from there in any case: each block below asks
  // for more than the heap was left with.
  EXPECT_EQ(MmappedBlocksAfterAllocating(10 << 20), before);
  {
    LargeBlocksFromMmap scope(8 << 20);
    EXPECT_EQ(MmappedBlocksAfterAllocating(20 << 20), before + 1);
    EXPECT_EQ(MmappedBlocksAfterAllocating(1 << 20), before);
  }
  EXPECT_EQ(MmappedBlocksAfterAllocating(20 << 20), before);
}

TEST(AllocatorTest, LargeBlocksFromMmapDoesNothingWhereTheEnvironmentOptedOut) {
  ASSERT_TRUE(ConfigureAllocatorForTraining());
  ::setenv("ENGINE_DEFAULT_MALLOC", "1", 1);
  EXPECT_FALSE(ConfigureAllocatorForTraining());
  ::unsetenv("ENGINE_DEFAULT_MALLOC");
  const size_t before = mallinfo2().hblks;
  {
    LargeBlocksFromMmap scope(8 << 20);
    // More than any test here left in the heap, less than the training settings' 32 MB.
    EXPECT_EQ(MmappedBlocksAfterAllocating(30 << 20), before);
  }
  ASSERT_TRUE(ConfigureAllocatorForTraining());
}

}  // namespace
}  // namespace engine
