#include "common/io/anonymous_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

// How many of the pages of [p, p + bytes) are resident in RAM.
size_t ResidentPages(const uint8_t* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  EXPECT_EQ(mincore(const_cast<uint8_t*>(p), bytes, in_core.data()), 0);
  size_t n = 0;
  for (unsigned char c : in_core) n += c & 1u;
  return n;
}

TEST(AnonymousMemoryTest, MapsZeroedWritableBytes) {
  AnonymousMemory m;
  EXPECT_EQ(m.data(), nullptr);
  ASSERT_TRUE(m.Map(100000));
  ASSERT_NE(m.data(), nullptr);
  EXPECT_EQ(m.size(), 100000u);
  for (size_t i = 0; i < m.size(); i += 997) EXPECT_EQ(m.data()[i], 0) << i;
  m.data()[m.size() - 1] = 7;
  EXPECT_EQ(m.data()[m.size() - 1], 7);
}

TEST(AnonymousMemoryTest, CommitsPagesOnlyAsTheyAreWritten) {
  constexpr size_t kBytes = size_t{64} << 20;
  AnonymousMemory m;
  ASSERT_TRUE(m.Map(kBytes));
  EXPECT_EQ(ResidentPages(m.data(), kBytes), 0u);
  m.data()[0] = 1;  // commits one page (a 2 MiB one where huge pages are on)
  const size_t resident = ResidentPages(m.data(), kBytes);
  EXPECT_GE(resident, 1u);
  EXPECT_LE(resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)), size_t{2} << 20);
}

TEST(AnonymousMemoryTest, LargeMappingsCoverWholeAlignedHugePages) {
  constexpr size_t kHuge = size_t{2} << 20;
  for (const size_t bytes : {kHuge, kHuge * 11 / 4, kHuge * 5 + 1}) {
    AnonymousMemory m;
    ASSERT_TRUE(m.Map(bytes));
    EXPECT_EQ(m.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % kHuge, 0u) << bytes;
    // The mapping runs on to the next huge-page boundary: mincore fails (ENOMEM) on unmapped
    // pages, so this checks the rounded-up tail is there.
    const size_t mapped = (bytes + kHuge - 1) / kHuge * kHuge;
    std::vector<unsigned char> in_core(mapped / static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    EXPECT_EQ(mincore(m.data(), mapped, in_core.data()), 0) << bytes;
    m.data()[bytes - 1] = 3;
  }
}

TEST(AnonymousMemoryTest, MovesOwnership) {
  AnonymousMemory a;
  ASSERT_TRUE(a.Map(4096));
  a.data()[1] = 5;
  uint8_t* p = a.data();
  AnonymousMemory b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[1], 5);
  AnonymousMemory c;
  ASSERT_TRUE(c.Map(1));
  c = std::move(b);  // unmaps c's own mapping
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 4096u);
}

TEST(AnonymousMemoryTest, FailedMapKeepsTheEarlierMapping) {
  AnonymousMemory m;
  ASSERT_TRUE(m.Map(4096));
  m.data()[0] = 9;
  uint8_t* p = m.data();
  EXPECT_FALSE(m.Map(std::numeric_limits<size_t>::max() / 2));  // beyond any address space
  EXPECT_EQ(m.data(), p);
  EXPECT_EQ(m.data()[0], 9);
  EXPECT_EQ(m.size(), 4096u);
}

}  // namespace
}  // namespace kvserve
