#include "worker/planner/kv_dtype.h"

#include "gtest/gtest.h"

namespace kvserve {
namespace {

TEST(KvDTypeTest, ParsesNamesAndRoundTrips) {
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    absl::StatusOr<KvCacheDType> parsed = ParseKvCacheDType(KvCacheDTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(*ParseKvCacheDType("BF16"), KvCacheDType::kBF16);
  EXPECT_EQ(*ParseKvCacheDType("bfloat16"), KvCacheDType::kBF16);
  EXPECT_EQ(*ParseKvCacheDType("fp8_e4m3"), KvCacheDType::kFp8E4M3);
  EXPECT_EQ(KvCacheDTypeName(KvCacheDType::kFp8E4M3), "fp8");
}

TEST(KvDTypeTest, RefusesAutoAndUnknown) {
  for (const char* name : {"auto", "", "int4", "fp16x"}) {
    absl::StatusOr<KvCacheDType> parsed = ParseKvCacheDType(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
}

TEST(KvDTypeTest, BytesPerHeadVector) {
  EXPECT_EQ(KvBytesPerHeadVector(KvCacheDType::kF32, 128), 512);
  EXPECT_EQ(KvBytesPerHeadVector(KvCacheDType::kF16, 128), 256);
  EXPECT_EQ(KvBytesPerHeadVector(KvCacheDType::kBF16, 128), 256);
  // One byte per element plus one f32 scale per token and head.
  EXPECT_EQ(KvBytesPerHeadVector(KvCacheDType::kInt8, 128), 132);
  EXPECT_EQ(KvBytesPerHeadVector(KvCacheDType::kFp8E4M3, 576), 580);
}

}  // namespace
}  // namespace kvserve
