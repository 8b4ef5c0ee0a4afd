#include "worker/planner/byte_size.h"

#include "gtest/gtest.h"

namespace kvserve {
namespace {

TEST(ByteSizeTest, ParsesUnits) {
  EXPECT_EQ(*ParseByteSize("80GiB"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("141GB"), int64_t{141'000'000'000});
  EXPECT_EQ(*ParseByteSize("1073741824"), int64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize(" 1.5 TiB "), int64_t{3} << 39);
  EXPECT_EQ(*ParseByteSize("512mib"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("64KB"), 64000);
  EXPECT_EQ(*ParseByteSize("100B"), 100);
}

TEST(ByteSizeTest, RefusesBadText) {
  for (const char* text : {"", "GiB", "80G", "80 parsecs", "1.5", "-3GB", "1e30TB"}) {
    EXPECT_EQ(ParseByteSize(text).status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
  EXPECT_NE(ParseByteSize("80G").status().message().find("80G"), std::string::npos);
}

TEST(ByteSizeTest, Formats) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{80} << 30), "80.00 GiB");
}

}  // namespace
}  // namespace kvserve
