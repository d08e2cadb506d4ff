#include "unicode.h"

#include <memory>

#include "inferd/status.h"

namespace inferd::unicode {
namespace {

const uint8_t* class_table() {
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(kMaxCodepoint + 1);
    for (size_t i = 0; i < kCptRangeCount; ++i) {
      const uint32_t end = i + 1 < kCptRangeCount ? kCptRanges[i + 1].start : kMaxCodepoint + 1;
      INFERD_ASSERT(kCptRanges[i].start < end && end <= kMaxCodepoint + 1, "unsorted class table");
      for (uint32_t cp = kCptRanges[i].start; cp < end; ++cp) t[cp] = kCptRanges[i].flags;
    }
    return t;
  }();
  return table.get();
}

bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

uint8_t cpt_class(uint32_t cp) {
  static const uint8_t* table = class_table();
  return cp <= kMaxCodepoint ? table[cp] : 0;
}

void decode_utf8(std::string_view text, std::vector<uint32_t>& out) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      i += 1;
    } else if ((b & 0x40) == 0) {
      out.push_back(kReplacement);
      i += 1;
    } else if ((b & 0x20) == 0) {
      if (i + 1 < n && is_cont(s[i + 1])) {
        out.push_back(((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu));
        i += 2;
      } else {
        out.push_back(kReplacement);
        i += 1;
      }
    } else if ((b & 0x10) == 0) {
      if (i + 2 < n && is_cont(s[i + 1]) && is_cont(s[i + 2])) {
        out.push_back(((b & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu));
        i += 3;
      } else {
        out.push_back(kReplacement);
        i += 1;
      }
    } else if ((b & 0x08) == 0) {
      if (i + 3 < n && is_cont(s[i + 1]) && is_cont(s[i + 2]) && is_cont(s[i + 3])) {
        out.push_back(((b & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) |
                      (s[i + 3] & 0x3Fu));
        i += 4;
      } else {
        out.push_back(kReplacement);
        i += 1;
      }
    } else {
      out.push_back(kReplacement);
      i += 1;
    }
  }
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp > kMaxCodepoint) cp = kReplacement;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace inferd::unicode
