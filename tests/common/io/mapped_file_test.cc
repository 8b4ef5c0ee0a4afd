#include "common/io/mapped_file.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util/scratch_dir.h"

namespace kvserve {
namespace {

std::string TempPath(const std::string& name) { return test_util::ScratchPath(name); }

TEST(MappedFileTest, MapsContents) {
  const std::string path = TempPath("mapped_file_test.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello kv";
  }
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->view(), "hello kv");
  MappedFile moved = std::move(*file);
  EXPECT_EQ(moved.size(), 8u);
  EXPECT_EQ(file->data(), nullptr);
  std::remove(path.c_str());
}

TEST(MappedFileTest, EmptyFileIsValid) {
  const std::string path = TempPath("mapped_file_empty.bin");
  { std::ofstream out(path, std::ios::binary); }
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 0u);
  std::remove(path.c_str());
}

TEST(MappedFileTest, MissingFileNamesPath) {
  absl::StatusOr<MappedFile> file = MappedFile::Open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(absl::IsNotFound(file.status()));
  EXPECT_NE(file.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);
}

TEST(MappedFileTest, DirectoryIsRefused) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(testing::TempDir());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace kvserve
