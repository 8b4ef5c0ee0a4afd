#include "kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::DecodeRows;
using testing::EncodeRows;
using testing::RandomFloats;

TEST(EmbeddingGatherTest, EveryDTypeDecodesExactly) {
  std::mt19937 rng(6);
  const int64_t vocab = 11;
  for (DType dtype :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
        DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int64_t blocks : {1, 3}) {
      const int64_t dim = blocks * std::max<int64_t>(32, DTypeBlockElems(dtype));
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " dim " + std::to_string(dim));
      const std::vector<uint8_t> table =
          EncodeRows(dtype, RandomFloats(vocab * dim, rng), vocab, dim);
      const std::vector<double> ref = DecodeRows(dtype, table, vocab, dim);
      const std::vector<int32_t> ids = {3, 0, 10, 3, 7};
      std::vector<float> out(ids.size() * dim);
      EmbeddingGather(table.data(), dtype, dim, ids.data(), static_cast<int64_t>(ids.size()),
                      out.data());
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int64_t e = 0; e < dim; ++e) {
          ASSERT_EQ(out[i * dim + e], ref[ids[i] * dim + e]) << "token " << i << " elem " << e;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
