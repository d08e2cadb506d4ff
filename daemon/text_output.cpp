#include "text_output.h"

#include <algorithm>

namespace inferd::daemon {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The byte ranges of a well-formed UTF-8 sequence (Unicode Table 3-7), by its lead byte: the sequence's
// length, and the range of its second byte (the others are 80..BF). Length 0: the byte never starts one.
struct Lead {
  int length;
  unsigned char lo, hi;
};

Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Decodes `in` onto `out`: well-formed characters are copied, each maximal ill-formed subpart becomes
// U+FFFD. Returns how many bytes at the end of `in` begin a character that the next bytes may complete
// (they are not consumed); 0 when `at_end` (such a tail is ill-formed then, and replaced).
size_t decode(std::string_view in, bool at_end, std::string* out) {
  size_t i = 0;
  while (i < in.size()) {
    const auto b = static_cast<unsigned char>(in[i]);
    const Lead lead = lead_of(b);
    if (lead.length == 1) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    if (lead.length == 0) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    size_t n = 1;  // bytes of this sequence that are well-formed so far
    while (n < static_cast<size_t>(lead.length) && i + n < in.size()) {
      const auto c = static_cast<unsigned char>(in[i + n]);
      const bool ok = n == 1 ? (c >= lead.lo && c <= lead.hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++n;
    }
    if (n == static_cast<size_t>(lead.length)) {
      out->append(in.substr(i, n));
    } else if (i + n == in.size() && !at_end) {
      return n;  // a character still to be completed
    } else {
      out->append(kReplacement);
    }
    i += n;
  }
  return 0;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  std::string decoded;
  decoded.reserve(s.size());
  return decode(s, /*at_end=*/true, &decoded) == 0 && decoded == s;
}

TextOutput::TextOutput(std::vector<std::string> stop) : stop_(std::move(stop)) {
  stop_.erase(std::remove_if(stop_.begin(), stop_.end(), [](const std::string& s) { return s.empty(); }), stop_.end());
}

bool TextOutput::cut_at_stop(std::string* out) {
  size_t first = std::string::npos;
  for (const auto& s : stop_) first = std::min(first, held_.find(s));
  if (first == std::string::npos) return false;
  stopped_ = true;
  *out = held_.substr(0, first);
  held_.clear();
  pending_.clear();
  return true;
}

std::string TextOutput::push(std::string_view piece) {
  if (stopped_) return {};
  pending_ += piece;
  const size_t tail = decode(pending_, /*at_end=*/false, &held_);
  pending_.erase(0, pending_.size() - tail);
  std::string out;
  if (cut_at_stop(&out)) return out;
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stop_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string TextOutput::finish() {
  if (stopped_) return {};
  decode(pending_, /*at_end=*/true, &held_);
  pending_.clear();
  std::string out;
  if (cut_at_stop(&out)) return out;
  out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace inferd::daemon
