// unicode.h (private to inferd_tokenizer) — code point classes and UTF-8 handling with llama.cpp's rules.
//
// The class table is generated (unicode_tables.cpp, tools/reference/gen_unicode_tables.py) and expanded
// once into a flat per-code-point byte array on first use.
// Thread safety: all functions are pure; the lazily built table is initialised thread-safely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace inferd::unicode {

// One byte per code point: the general-category group (at most one bit of the low seven) and a
// whitespace bit. Unassigned code points (Cn) and values past U+10FFFF have no category bit.
enum CptClass : uint8_t {
  kNumber = 0x01,       // \p{N}
  kLetter = 0x02,       // \p{L}
  kPunctuation = 0x04,  // \p{P}
  kSymbol = 0x08,       // \p{S}
  kMark = 0x10,         // \p{M}
  kSeparator = 0x20,    // \p{Z}
  kControl = 0x40,      // \p{C} except Cn
  kWhitespace = 0x80,   // llama.cpp's whitespace set (Unicode White_Space)
};

struct CptRange {
  uint32_t start;
  uint8_t flags;
};
extern const CptRange kCptRanges[];
extern const size_t kCptRangeCount;

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr uint32_t kReplacement = 0xFFFD;

uint8_t cpt_class(uint32_t cp);

// Decodes like llama.cpp's unicode_cpts_from_utf8: overlong forms and surrogates are accepted as
// the values they encode (lead bytes F0..F7 can yield values up to 0x1FFFFF); a byte that does not
// start a complete sequence becomes U+FFFD and decoding resumes at the next byte.
void decode_utf8(std::string_view text, std::vector<uint32_t>& out);

// Appends the UTF-8 form of `cp` (surrogates encoded as-is). Values past U+10FFFF, which llama.cpp
// rejects with an exception, are written as U+FFFD.
void append_utf8(uint32_t cp, std::string& out);

// The sequence length a lead byte announces, as llama.cpp's unicode_len_utf8 (continuation and
// invalid bytes count as 1, F8..FF as 4).
inline size_t utf8_len_from_lead(char c) {
  static constexpr uint8_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[static_cast<uint8_t>(c) >> 4];
}

}  // namespace inferd::unicode
