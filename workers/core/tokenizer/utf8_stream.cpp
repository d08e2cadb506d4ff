#include "inferd/tokenizer.h"

namespace inferd {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// The length a valid lead byte announces, or 0 for a byte that cannot start a sequence.
size_t sequence_length(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether `b` may follow `lead` as the sequence's second byte (excludes overlongs, surrogates and
// values past U+10FFFF); later bytes only need to be continuation bytes.
bool valid_second(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const auto* s = reinterpret_cast<const uint8_t*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    const size_t need = sequence_length(s[i]);
    if (need == 0) {
      out.append(kReplacement);
      ++i;
      continue;
    }
    // Count the bytes that continue this sequence validly so far.
    size_t ok = 1;
    while (ok < need && i + ok < n) {
      const bool valid = ok == 1 ? valid_second(s[i], s[i + ok]) : (s[i + ok] & 0xC0) == 0x80;
      if (!valid) break;
      ++ok;
    }
    if (ok == need) {
      out.append(pending_, i, need);
      i += need;
    } else if (i + ok == n) {
      break;  // incomplete so far: wait for more bytes
    } else {
      out.append(kReplacement);  // the maximal invalid subpart; resume at the offending byte
      i += ok;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  if (!pending_.empty()) out.append(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace inferd
