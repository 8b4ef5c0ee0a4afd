#ifndef KVSERVE_COMMON_TOKENIZER_TOKEN_BYTES_H_
#define KVSERVE_COMMON_TOKENIZER_TOKEN_BYTES_H_

#include <string>

#include "common/token.h"

namespace kvserve {

class Tokenizer;

/// The bytes token `id` adds to text that already has something before it: what decoding it
/// after another token adds (so SentencePiece's "▁the" is " the", where decoded alone it would
/// lose its space), and the raw byte for byte-fallback (<0xE2>) and byte-level pieces that are
/// part of a UTF-8 character. Empty when it adds none or cannot be represented. Used for the
/// constraint trie (worker/constraint) and for logprob tokens in the HTTP front.
std::string TokenBytesMidText(const Tokenizer& tokenizer, TokenId id);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_TOKEN_BYTES_H_
