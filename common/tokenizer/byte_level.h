#ifndef KVSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define KVSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <string>
#include <string_view>

namespace kvserve {

/// GPT-2's reversible byte <-> character map. Byte-level BPE vocabularies spell every byte as one
/// printable character: the bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves, the
/// other 68 bytes take U+0100, U+0101, ... in byte order (so ' ' is 'Ġ' U+0120, '\n' is 'Ċ').

/// Appends the byte-level spelling of each byte of `bytes` to `out`.
void BytesToByteLevel(std::string_view bytes, std::string* out);

/// Maps a byte-level token back to raw bytes. Returns false (leaving `out` partly written) when
/// some character of `token` is not in the map.
bool ByteLevelToBytes(std::string_view token, std::string* out);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_
