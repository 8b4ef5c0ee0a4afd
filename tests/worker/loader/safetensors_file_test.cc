#include "worker/loader/safetensors_file.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gguf/gguf_writer.h"
#include "common/io/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/test_util/scratch_dir.h"
#include "worker/loader/safetensors_writer.h"

namespace kvserve {
namespace {

const std::string kShared = KVSERVE_SHARED_DIR;
const std::string kHfModel = kShared + "/models/stories260K-hf/model.safetensors";

std::string TempPath(const std::string& name) { return test_util::ScratchPath(name); }

absl::StatusOr<SafetensorsFile> ParseBytes(const std::string& name, const std::string& bytes) {
  EXPECT_TRUE(WriteStringToFile(TempPath(name), bytes).ok());
  return SafetensorsFile::Open(TempPath(name));
}

void ExpectError(const absl::StatusOr<SafetensorsFile>& f, const std::string& file,
                 const std::string& what) {
  ASSERT_FALSE(f.ok()) << "expected an error containing: " << what;
  const std::string msg(f.status().message());
  EXPECT_EQ(msg.rfind(TempPath(file) + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

/// A file with a raw JSON header (padded to 8 bytes) and `data_bytes` zero bytes of data.
std::string RawFile(std::string header, size_t data_bytes) {
  header.resize((header.size() + 7) / 8 * 8, ' ');
  const uint64_t len = header.size();
  std::string out(reinterpret_cast<const char*>(&len), 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsFileTest, ParsesStories260K) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(kHfModel);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tensors().size(), 47u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->data_offset() % 8, 0u);
  const SafetensorsTensor* embed = f->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->dtype, DType::kF32);
  EXPECT_EQ(embed->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(embed->nbytes(), 512u * 64 * 4);
  EXPECT_EQ(embed->data, f->file().data() + f->data_offset() + embed->begin);
  EXPECT_EQ(f->Find("lm_head.weight"), nullptr);
  // Independent reference: the llama2.c checkpoint's embedding follows its 28-byte header.
  absl::StatusOr<std::string> bin =
      ReadFileToString(kShared + "/models/stories260K/stories260K.bin");
  ASSERT_TRUE(bin.ok());
  EXPECT_EQ(std::memcmp(embed->data, bin->data() + 28, embed->nbytes()), 0);
  const SafetensorsTensor* down = f->Find("model.layers.2.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{64, 172}));
}

TEST(SafetensorsFileTest, WriterRoundTrip) {
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.AddTensor("a", DType::kF16, {3}, std::string("\x00\x3c\x00\x40\x00\x42", 6));
  w.AddTensor("b", DType::kBF16, {2, 1}, std::string("\x80\x3f\x00\x40", 4));
  const float f32[2] = {1.5f, -2.0f};
  w.AddTensor("c", DType::kF32, {2}, std::string(reinterpret_cast<const char*>(f32), 8));
  w.AddTensor("scalar", DType::kF32, {}, std::string(4, '\0'));
  absl::StatusOr<SafetensorsFile> f = ParseBytes("rt.safetensors", w.Serialize());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().size(), 1u);
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->Find("a")->dtype, DType::kF16);
  EXPECT_EQ(f->Find("b")->dtype, DType::kBF16);
  EXPECT_EQ(f->Find("b")->shape, (std::vector<int64_t>{2, 1}));
  EXPECT_TRUE(f->Find("scalar")->shape.empty());
  float c[2];
  std::memcpy(c, f->Find("c")->data, 8);
  EXPECT_EQ(c[0], 1.5f);
  EXPECT_EQ(c[1], -2.0f);
  EXPECT_EQ(f->Find("c")->begin % 8, 0u);
}

TEST(SafetensorsFileTest, TruncatedFileNeverParses) {
  absl::StatusOr<std::string> bytes = ReadFileToString(kHfModel);
  ASSERT_TRUE(bytes.ok());
  const std::string path = TempPath("truncated.safetensors");
  ASSERT_TRUE(WriteStringToFile(path, *bytes).ok());
  std::vector<size_t> cuts;
  for (size_t cut = 0; cut < bytes->size(); cut += 997) cuts.push_back(cut);
  cuts.push_back(bytes->size() - 1);
  std::sort(cuts.rbegin(), cuts.rend());
  for (size_t cut : cuts) {
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(cut)), 0);
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << "cut at " << cut;
    EXPECT_EQ(f.status().message().rfind(path + ": ", 0), 0u) << f.status();
  }
}

TEST(SafetensorsFileTest, RandomCorruptionNeverCrashes) {
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.AddTensor("x.weight", DType::kF32, {2, 3}, std::string(24, '\1'));
  w.AddTensor("y.bias", DType::kF16, {5}, std::string(10, '\2'));
  const std::string good = w.Serialize();
  std::mt19937 rng(42);
  for (int i = 0; i < 500; ++i) {
    std::string bad = good;
    for (int j = 0; j < 2; ++j) {
      bad[rng() % bad.size()] = "0123456789{}[]\":,-e. \xff"[rng() % 22];
    }
    absl::StatusOr<SafetensorsFile> f = ParseBytes("fuzz.safetensors", bad);
    if (!f.ok()) continue;
    for (const SafetensorsTensor& t : f->tensors()) {
      ASSERT_LE(t.data + t.nbytes(), f->file().data() + f->file().size());
    }
  }
}

TEST(SafetensorsFileTest, Errors) {
  ExpectError(ParseBytes("short.safetensors", "abc"), "short.safetensors", "too short");
  std::string huge(8, '\0');
  const uint64_t len = 1ull << 40;
  std::memcpy(huge.data(), &len, 8);
  ExpectError(ParseBytes("hlen.safetensors", huge + "{}"), "hlen.safetensors",
              "header length 1099511627776 exceeds the file size 10");
  ExpectError(ParseBytes("json.safetensors", RawFile("{\"a\": [", 0)), "json.safetensors",
              "invalid JSON header");
  ExpectError(ParseBytes("arr.safetensors", RawFile("[1, 2]", 0)), "arr.safetensors",
              "JSON header is not an object");
  ExpectError(
      ParseBytes(
          "dtype.safetensors",
          RawFile(R"({"t.weight": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", 16)),
      "dtype.safetensors",
      "tensor 't.weight' has unsupported dtype 'I64' (supported: F32, F16, BF16)");
  ExpectError(
      ParseBytes(
          "shape.safetensors",
          RawFile(R"({"t": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}})", 16)),
      "shape.safetensors",
      "tensor 't' has shape [2, 3] of F32 (24 bytes) but data_offsets span 16 bytes");
  ExpectError(
      ParseBytes("neg.safetensors",
                 RawFile(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)),
      "neg.safetensors", "tensor 't' has an invalid dimension -1");
  ExpectError(
      ParseBytes("past.safetensors",
                 RawFile(R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 16)),
      "past.safetensors",
      "tensor 't' has data_offsets [8, 24] past the end of the data section "
      "(16 bytes)");
  ExpectError(
      ParseBytes("order.safetensors",
                 RawFile(R"({"t": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 16)),
      "order.safetensors", "begin > end");
  ExpectError(
      ParseBytes("offs.safetensors",
                 RawFile(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4)),
      "offs.safetensors", "tensor 't' has no 'data_offsets' pair");
  ExpectError(ParseBytes("ovf.safetensors",
                         RawFile(R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296],
                         "data_offsets": [0, 4]}})",
                                 4)),
              "ovf.safetensors", "tensor 't' has a shape whose byte size overflows");
  ExpectError(ParseBytes("meta.safetensors", RawFile(R"({"__metadata__": {"a": 1}})", 0)),
              "meta.safetensors", "__metadata__ entry 'a' is not a string");
  ExpectError(ParseBytes("entry.safetensors", RawFile(R"({"t": 5})", 0)), "entry.safetensors",
              "tensor 't' is not a JSON object");
  SafetensorsWriter w;
  w.AddTensor("x", "F64", {1}, std::string(8, '\0'));
  ExpectError(ParseBytes("f64.safetensors", w.Serialize()), "f64.safetensors",
              "tensor 'x' has unsupported dtype 'F64'");
}

}  // namespace
}  // namespace kvserve
