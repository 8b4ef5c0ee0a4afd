#include "common/gguf/gguf_file.h"

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

namespace kvserve {
namespace {

const std::string kShared = KVSERVE_SHARED_DIR;
const std::string kGgufPath = kShared + "/models/stories260K/stories260K.gguf";
const std::string kBinPath = kShared + "/models/stories260K/stories260K.bin";

std::string TempPath(const std::string& name) { return test_util::ScratchPath(name); }

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

/// Writes `bytes` to a temp file and parses it.
absl::StatusOr<GgufFile> ParseBytes(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteStringToFile(path, bytes).ok());
  return GgufFile::Open(path);
}

/// Expects a non-OK status whose message names the file and contains `what`.
void ExpectError(const absl::StatusOr<GgufFile>& f, const std::string& file,
                 const std::string& what) {
  ASSERT_FALSE(f.ok()) << "expected an error containing: " << what;
  const std::string msg(f.status().message());
  EXPECT_EQ(msg.rfind(TempPath(file) + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

/// Byte position of the uint64 offset field of tensor `name` in a serialized file.
size_t TensorOffsetField(const std::string& bytes, const std::string& name, uint32_t n_dims) {
  std::string needle(8, '\0');
  const uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  needle += name;
  const size_t pos = bytes.find(needle);
  EXPECT_NE(pos, std::string::npos);
  return pos + needle.size() + 4 + 8 * n_dims + 4;
}

template <typename T>
void Patch(std::string* bytes, size_t pos, T v) {
  std::memcpy(bytes->data() + pos, &v, sizeof(T));
}

/// A small valid file: a few keys and two tensors.
GgufWriter SmallWriter() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.block_count", 1);
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", "c"});
  w.SetF32Array("tokenizer.ggml.scores", {0.5f, -1.0f, 2.0f});
  w.AddTensor("w", GgmlType::kF32, {4, 2}, Floats({1, 2, 3, 4, 5, 6, 7, 8}));
  w.AddTensor("v", GgmlType::kF32, {3}, Floats({9, 10, 11}));
  return w;
}

TEST(GgufFileTest, ParsesStories260K) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(kGgufPath);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetU32("llama.embedding_length"), 64u);
  EXPECT_EQ(*f->GetU32("llama.context_length"), 512u);
  EXPECT_FLOAT_EQ(*f->GetF32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(f->Find("llama.block_count")->type(), GgufType::kUint32);
  absl::StatusOr<std::vector<std::string>> tokens = f->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[1], "<s>");
  absl::StatusOr<std::vector<int32_t>> types = f->GetI32Array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_EQ((*types)[3], 6);

  const GgufTensorInfo* embd = f->FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(embd->type, GgmlType::kF32);
  EXPECT_EQ(embd->nbytes, 64u * 512 * 4);
  EXPECT_EQ(embd->data, f->file().data() + f->data_offset() + embd->offset);
  const GgufTensorInfo* k3 = f->FindTensor("blk.3.attn_k.weight");
  ASSERT_NE(k3, nullptr);
  EXPECT_EQ(k3->dims, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(f->FindTensor("nope"), nullptr);

  // Independent reference: the llama2.c checkpoint holds the same floats (28-byte header, then
  // the embedding, rms_att[5], wq[5], wk[5], ...).
  absl::StatusOr<std::string> bin = ReadFileToString(kBinPath);
  ASSERT_TRUE(bin.ok());
  const size_t embd_off = 28;
  EXPECT_EQ(std::memcmp(embd->data, bin->data() + embd_off, embd->nbytes), 0);
  const size_t wk_off = 28 + 4 * (512 * 64 + 5 * 64 + 5 * 64 * 64 + 3 * 32 * 64);
  EXPECT_EQ(std::memcmp(k3->data, bin->data() + wk_off, k3->nbytes), 0);
}

TEST(GgufFileTest, GettersNameKeyOnError) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(kGgufPath);
  ASSERT_TRUE(f.ok());
  absl::StatusOr<uint32_t> wrong = f->GetU32("general.architecture");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().message(),
            kGgufPath + ": metadata key 'general.architecture' has type string, expected uint32");
  absl::StatusOr<std::string> missing = f->GetString("general.nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), kGgufPath + ": metadata key 'general.nope' is missing");
  absl::StatusOr<std::vector<std::string>> not_strings = f->GetStringArray("tokenizer.ggml.scores");
  ASSERT_FALSE(not_strings.ok());
  EXPECT_NE(not_strings.status().message().find("array of float32"), std::string::npos);
  EXPECT_FALSE(f->GetF32Array("tokenizer.ggml.tokens").ok());
  EXPECT_FALSE(f->GetI32Array("tokenizer.ggml.scores").ok());
  EXPECT_FALSE(f->GetBool("llama.block_count").ok());
}

TEST(GgufFileTest, WriterRoundTripsEveryTypeAndAlignment) {
  GgufWriter w(GgufWriter::Options{.version = 2, .alignment = 64});
  w.Set("u8", GgufValue::U8(200));
  w.Set("i8", GgufValue::I8(-100));
  w.Set("u16", GgufValue::U16(60000));
  w.Set("i16", GgufValue::I16(-30000));
  w.SetU32("u32", 4000000000u);
  w.SetI32("i32", -2000000000);
  w.SetF32("f32", 1.5f);
  w.SetBool("bool", true);
  w.SetString("str", std::string("h\0i", 3));
  w.Set("u64", GgufValue::U64(1ull << 60));
  w.Set("i64", GgufValue::I64(-(1ll << 60)));
  w.Set("f64", GgufValue::F64(0.1));
  w.SetI32Array("ints", {1, -2, 3});
  w.Set("nested",
        GgufValue::Array(GgufType::kArray,
                         {GgufValue::Array(GgufType::kUint8, {GgufValue::U8(1)}),
                          GgufValue::Array(GgufType::kString,
                                           {GgufValue::String("x"), GgufValue::String("yz")})}));
  w.Set("empty", GgufValue::Array(GgufType::kFloat32, {}));
  std::string q8(2 * 34, '\x11');
  w.AddTensor("f32", GgmlType::kF32, {3}, Floats({1, 2, 3}));
  w.AddTensor("f16", GgmlType::kF16, {2, 2}, std::string("\x00\x3c\x00\x40\x00\x42\x00\x44", 8));
  w.AddTensor("q8", GgmlType::kQ8_0, {32, 2}, q8);
  w.AddTensor("q4", GgmlType::kQ4_0, {64}, std::string(36, '\x22'));
  w.AddTensor("bf16", GgmlType::kBF16, {1}, std::string("\x80\x3f", 2));
  absl::StatusOr<GgufFile> f = ParseBytes("roundtrip.gguf", w.Serialize());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->Find("u8")->type(), GgufType::kUint8);
  EXPECT_EQ(*f->GetU32("u8"), 200u);
  EXPECT_EQ(*f->GetI32("i8"), -100);
  EXPECT_EQ(*f->GetU32("u16"), 60000u);
  EXPECT_EQ(*f->GetI32("i16"), -30000);
  EXPECT_EQ(*f->GetU32("u32"), 4000000000u);
  EXPECT_FALSE(f->GetI32("u32").ok());  // does not fit
  EXPECT_EQ(*f->GetI32("i32"), -2000000000);
  EXPECT_FALSE(f->GetU32("i32").ok());  // negative
  EXPECT_EQ(*f->GetF32("f32"), 1.5f);
  EXPECT_EQ(*f->GetBool("bool"), true);
  EXPECT_EQ(*f->GetString("str"), std::string("h\0i", 3));
  EXPECT_EQ(*f->GetU64("u64"), 1ull << 60);
  EXPECT_EQ(*f->Find("i64")->AsInt64(), -(1ll << 60));
  EXPECT_EQ(f->Find("f64")->type(), GgufType::kFloat64);
  EXPECT_EQ(*f->Find("f64")->AsDouble(), 0.1);
  EXPECT_EQ(*f->GetI32Array("ints"), (std::vector<int32_t>{1, -2, 3}));
  const GgufArray* nested = f->Find("nested")->AsArray();
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->elements.size(), 2u);
  EXPECT_EQ(*nested->elements[0].AsArray()->elements[0].AsUint64(), 1u);
  EXPECT_EQ(*nested->elements[1].AsArray()->elements[1].AsString(), "yz");
  EXPECT_TRUE(f->GetF32Array("empty")->empty());
  ASSERT_EQ(f->tensors().size(), 5u);
  for (const GgufTensorInfo& t : f->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u) << t.name;
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
  }
  EXPECT_EQ(f->FindTensor("q8")->nbytes, 68u);
  EXPECT_EQ(std::memcmp(f->FindTensor("q8")->data, q8.data(), 68), 0);
  EXPECT_EQ(f->FindTensor("q4")->nbytes, 36u);
  EXPECT_EQ(f->FindTensor("f16")->dims, (std::vector<int64_t>{2, 2}));
  const float* f32 = reinterpret_cast<const float*>(f->FindTensor("f32")->data);
  EXPECT_EQ(f32[2], 3.0f);
}

TEST(GgufFileTest, TruncatedFileNeverParses) {
  absl::StatusOr<std::string> bytes = ReadFileToString(kGgufPath);
  ASSERT_TRUE(bytes.ok());
  const std::string path = TempPath("truncated.gguf");
  ASSERT_TRUE(WriteStringToFile(path, *bytes).ok());
  std::vector<size_t> cuts;
  for (size_t cut = 0; cut < bytes->size(); cut += 997) cuts.push_back(cut);
  for (size_t cut : {1ul, 3ul, 4ul, 8ul, 23ul, 24ul, 14175ul, bytes->size() - 1})
    cuts.push_back(cut);
  std::sort(cuts.rbegin(), cuts.rend());  // shrink the one file step by step
  for (size_t cut : cuts) {
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(cut)), 0);
    absl::StatusOr<GgufFile> f = GgufFile::Open(path);
    ASSERT_FALSE(f.ok()) << "cut at " << cut;
    EXPECT_EQ(f.status().message().rfind(path + ": ", 0), 0u) << f.status();
  }
}

TEST(GgufFileTest, RandomCorruptionNeverCrashes) {
  const std::string good = SmallWriter().Serialize();
  ASSERT_TRUE(ParseBytes("fuzz.gguf", good).ok());
  std::mt19937 rng(1234);
  int failures = 0;
  for (int i = 0; i < 500; ++i) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int j = 0; j < flips; ++j) {
      const size_t pos = rng() % bad.size();
      bad[pos] = static_cast<char>(rng() % 3 == 0 ? 0xff : rng());
    }
    absl::StatusOr<GgufFile> f = ParseBytes("fuzz.gguf", bad);
    if (!f.ok()) {
      ++failures;
      continue;
    }
    for (const GgufTensorInfo& t : f->tensors()) {  // every range must lie inside the mapping
      ASSERT_GE(t.data, f->file().data());
      ASSERT_LE(t.data + t.nbytes, f->file().data() + f->file().size());
    }
  }
  EXPECT_GT(failures, 50);
}

TEST(GgufFileTest, RejectsBadMagicAndVersion) {
  std::string bytes = SmallWriter().Serialize();
  std::string bad = bytes;
  bad[0] = 'X';
  ExpectError(ParseBytes("magic.gguf", bad), "magic.gguf", "not a GGUF file (bad magic)");
  for (uint32_t version : {1u, 4u}) {
    bad = bytes;
    Patch<uint32_t>(&bad, 4, version);
    ExpectError(ParseBytes("version.gguf", bad), "version.gguf",
                "unsupported GGUF version " + std::to_string(version));
  }
  ExpectError(ParseBytes("empty.gguf", ""), "empty.gguf", "too short");
}

TEST(GgufFileTest, RejectsHugeCountsAndLengths) {
  const std::string bytes = SmallWriter().Serialize();
  std::string bad = bytes;
  Patch<uint64_t>(&bad, 8, 1ull << 40);  // tensor count
  ExpectError(ParseBytes("count.gguf", bad), "count.gguf", "tensor count 1099511627776 exceeds");
  bad = bytes;
  Patch<uint64_t>(&bad, 16, ~0ull);  // metadata count
  ExpectError(ParseBytes("kvcount.gguf", bad), "kvcount.gguf", "metadata count");
  bad = bytes;
  Patch<uint64_t>(&bad, 24, 1ull << 62);  // length of the first key
  ExpectError(ParseBytes("strlen.gguf", bad), "strlen.gguf",
              "metadata key #0 claims 4611686018427387904 bytes");
  // The token array: key, type 9, element type 8, then the count.
  const std::string key = "tokenizer.ggml.tokens";
  const size_t count_pos = bytes.find(key) + key.size() + 4 + 4;
  bad = bytes;
  Patch<uint64_t>(&bad, count_pos, 1ull << 61);
  ExpectError(ParseBytes("arrlen.gguf", bad), "arrlen.gguf",
              "array 'tokenizer.ggml.tokens' claims 2305843009213693952 elements");
  bad = bytes;
  Patch<uint32_t>(&bad, count_pos - 4, 77);  // element type
  ExpectError(ParseBytes("arrtype.gguf", bad), "arrtype.gguf", "array of unknown type 77");
}

TEST(GgufFileTest, RejectsBadTensorInfos) {
  {
    GgufWriter w;
    w.AddTensor("blk.0.attn_q.weight", static_cast<GgmlType>(10), {32}, std::string(32, 'x'));
    ExpectError(ParseBytes("type.gguf", w.Serialize()), "type.gguf",
                "tensor 'blk.0.attn_q.weight' has unsupported ggml type 10");
  }
  {
    GgufWriter w;
    w.AddTensor("dup", GgmlType::kF32, {1}, Floats({1}));
    w.AddTensor("dup", GgmlType::kF32, {1}, Floats({2}));
    ExpectError(ParseBytes("dup.gguf", w.Serialize()), "dup.gguf", "duplicate tensor name 'dup'");
  }
  {
    GgufWriter w;
    w.AddTensor("big", GgmlType::kF32, {1ll << 32, 1ll << 32}, Floats({1}));
    ExpectError(ParseBytes("overflow.gguf", w.Serialize()), "overflow.gguf",
                "tensor 'big' has too many elements");
  }
  {
    GgufWriter w;
    w.AddTensor("zero", GgmlType::kF32, {4, 0}, "");
    ExpectError(ParseBytes("zero.gguf", w.Serialize()), "zero.gguf",
                "tensor 'zero' has invalid dimension 0");
  }
  {
    GgufWriter w;
    w.AddTensor("five", GgmlType::kF32, {1, 1, 1, 1, 1}, Floats({1}));
    ExpectError(ParseBytes("dims.gguf", w.Serialize()), "dims.gguf", "has 5 dimensions");
  }
  {
    GgufWriter w;
    w.AddTensor("q", GgmlType::kQ8_0, {48}, std::string(51, 'x'));
    ExpectError(ParseBytes("q8row.gguf", w.Serialize()), "q8row.gguf",
                "tensor 'q' of type Q8_0 has row length 48, not a multiple of the block size 32");
  }
  {
    GgufWriter w;
    w.AddTensor("k", GgmlType::kQ5_K, {128, 2}, std::string(176, 'x'));
    ExpectError(ParseBytes("q5krow.gguf", w.Serialize()), "q5krow.gguf",
                "tensor 'k' of type Q5_K has row length 128, not a multiple of the block size 256");
  }
  {
    GgufWriter w;
    w.AddTensor("short", GgmlType::kF32, {16}, Floats({1, 2}));  // data shorter than 16 floats
    ExpectError(ParseBytes("short.gguf", w.Serialize()), "short.gguf",
                "tensor 'short' data (offset 0, 64 bytes) extends past the end of the file");
  }
}

// The block formats' ggml numbers, names and sizes (256-element super-blocks for the K-quants).
TEST(GgufFileTest, BlockTypesHaveTheirSizes) {
  struct Case {
    GgmlType type;
    uint32_t number;
    const char* name;
    int64_t row;
    uint64_t bytes;
  };
  const Case cases[] = {
      {GgmlType::kQ4_1, 3, "Q4_1", 64, 40},    {GgmlType::kQ5_0, 6, "Q5_0", 64, 44},
      {GgmlType::kQ5_1, 7, "Q5_1", 64, 48},    {GgmlType::kQ4_K, 12, "Q4_K", 512, 288},
      {GgmlType::kQ5_K, 13, "Q5_K", 512, 352}, {GgmlType::kQ6_K, 14, "Q6_K", 512, 420}};
  GgufWriter w;
  for (const Case& c : cases) {
    EXPECT_EQ(static_cast<uint32_t>(c.type), c.number);
    EXPECT_EQ(GgmlTypeName(c.type), c.name);
    EXPECT_EQ(GgmlRowBytes(c.type, c.row), c.bytes) << c.name;
    EXPECT_EQ(GgmlRowBytes(c.type, c.row + 16), std::nullopt) << c.name;  // partial block
    w.AddTensor(c.name, c.type, {c.row, 3}, std::string(3 * c.bytes, '\x5a'));
  }
  absl::StatusOr<GgufFile> f = ParseBytes("blocks.gguf", w.Serialize());
  ASSERT_TRUE(f.ok()) << f.status();
  for (const Case& c : cases) {
    const GgufTensorInfo* t = f->FindTensor(c.name);
    ASSERT_NE(t, nullptr) << c.name;
    EXPECT_EQ(t->type, c.type);
    EXPECT_EQ(t->nbytes, 3 * c.bytes) << c.name;
  }
}

TEST(GgufFileTest, RejectsBadTensorOffsets) {
  const std::string bytes = SmallWriter().Serialize();
  const size_t field = TensorOffsetField(bytes, "v", 1);
  std::string bad = bytes;
  Patch<uint64_t>(&bad, field, 1ull << 20);
  ExpectError(ParseBytes("offset.gguf", bad), "offset.gguf",
              "tensor 'v' data (offset 1048576, 12 bytes) extends past the end of the file");
  bad = bytes;
  Patch<uint64_t>(&bad, field, ~0ull << 5);  // aligned, and offset + size overflows
  ExpectError(ParseBytes("offset2.gguf", bad), "offset2.gguf", "extends past the end");
  bad = bytes;
  Patch<uint64_t>(&bad, field, 4);
  ExpectError(ParseBytes("misaligned.gguf", bad), "misaligned.gguf",
              "tensor 'v' offset 4 is not a multiple of the alignment 32");
}

TEST(GgufFileTest, RejectsBadMetadata) {
  {
    GgufWriter w;
    w.SetU32("general.alignment", 48);
    ExpectError(ParseBytes("align.gguf", w.Serialize()), "align.gguf",
                "general.alignment 48 is not a power of two");
  }
  {
    GgufWriter w;
    w.SetString("general.alignment", "32");
    ExpectError(ParseBytes("align2.gguf", w.Serialize()), "align2.gguf",
                "general.alignment has type string, expected uint32");
  }
  {
    GgufValue v = GgufValue::Array(GgufType::kUint8, {});
    for (int i = 0; i < 20; ++i) v = GgufValue::Array(GgufType::kArray, {v});
    GgufWriter w;
    w.Set("deep", v);
    ExpectError(ParseBytes("deep.gguf", w.Serialize()), "deep.gguf",
                "metadata key 'deep' nests arrays deeper than 8");
  }
  {
    // Two keys with the same name: write "a" and "b", then rename "b" to "a".
    GgufWriter w;
    w.SetU32("a", 1);
    w.SetU32("b", 2);
    std::string bytes = w.Serialize();
    bytes[bytes.rfind('b')] = 'a';
    ExpectError(ParseBytes("dupkey.gguf", bytes), "dupkey.gguf", "duplicate metadata key 'a'");
  }
  {
    GgufWriter w;
    w.SetU32("k", 1);
    std::string bytes = w.Serialize();
    Patch<uint32_t>(&bytes, 24 + 8 + 1, 99);  // the value type
    ExpectError(ParseBytes("vtype.gguf", bytes), "vtype.gguf",
                "metadata key 'k' has unknown value type 99");
  }
}

}  // namespace
}  // namespace kvserve
