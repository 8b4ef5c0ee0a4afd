#ifndef KVSERVE_COMMON_TOKEN_H_
#define KVSERVE_COMMON_TOKEN_H_

#include <cstdint>

namespace kvserve {

/// A token id in a model's vocabulary. Signed so that -1 can mean "none" in tables; valid ids
/// are always in [0, vocab_size).
using TokenId = int32_t;

inline constexpr TokenId kNoToken = -1;

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKEN_H_
