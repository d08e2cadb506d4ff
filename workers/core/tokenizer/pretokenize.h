// pretokenize.h (private to inferd_tokenizer) — the pre-tokenizer splits of llama.cpp's BPE vocabularies.
//
// A pre-tokenizer is a list of steps applied in order; each step re-splits every segment produced by
// the previous one (text between matches stays a segment of its own), as llama.cpp's
// unicode_regex_split does. The steps are hand-written matchers equivalent to the regexes llama.cpp
// uses for each `tokenizer.ggml.pre` name.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace inferd::pretok {

enum class Step : uint8_t {
  kGpt2,            // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
  kLlama3,          // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,           // as kLlama3 with \p{N} (one digit per word)
  kEachNumber,      // \p{N}
  kNumberRuns,      // \p{N}+
  kPunctRuns,       // [\p{P}\$\+<=>\^~\|]+
  kPunctRunsTick,   // [\p{P}\$\+<=>\^~\|`]+
  kAsciiDigits3,    // [0-9][0-9][0-9]
};

// Splits `cpts` into words; `lengths` receives each word's length in code points (all > 0, summing
// to cpts.size()).
void split(std::span<const Step> steps, std::span<const uint32_t> cpts, std::vector<size_t>& lengths);

}  // namespace inferd::pretok
