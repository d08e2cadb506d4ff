#include "text_output.h"

#include <algorithm>

namespace inferd::daemon {
namespace {

// Bytes at the end of `s` that start a UTF-8 sequence not yet complete.
size_t incomplete_utf8_tail(std::string_view s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = (c & 0x80) == 0 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

TextOutput::TextOutput(std::vector<std::string> stop) : stop_(std::move(stop)) {
  stop_.erase(std::remove_if(stop_.begin(), stop_.end(), [](const std::string& s) { return s.empty(); }), stop_.end());
}

std::string TextOutput::push(std::string_view piece) {
  if (stopped_) return {};
  held_ += piece;
  size_t first = std::string::npos;
  for (const auto& s : stop_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
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
  hold = std::max(hold, incomplete_utf8_tail(held_));
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string TextOutput::finish() {
  if (stopped_) return {};
  size_t bad = incomplete_utf8_tail(held_);
  std::string out = held_.substr(0, held_.size() - bad);
  if (bad) out += "\xEF\xBF\xBD";
  held_.clear();
  return out;
}

}  // namespace inferd::daemon
