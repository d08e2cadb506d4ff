#include "pretokenize.h"

#include "unicode.h"

namespace inferd::pretok {
namespace {

using unicode::cpt_class;

// Code point classes as llama.cpp's std::regex fallback sees them: ASCII by its own character
// classes, everything else collapsed to its category (whitespace first).
bool regex_is_number(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const uint8_t k = cpt_class(c);
  return !(k & unicode::kWhitespace) && (k & unicode::kNumber);
}

bool regex_is_punct(uint32_t c, bool with_backtick) {
  if (c < 0x80) {
    switch (c) {
      case '!': case '"': case '#': case '%': case '&': case '\'': case '(': case ')': case '*':
      case ',': case '-': case '.': case '/': case ':': case ';': case '?': case '@': case '[':
      case '\\': case ']': case '_': case '{': case '}': case '$': case '+': case '<': case '=':
      case '>': case '^': case '~': case '|':
        return true;
      case '`':
        return with_backtick;
      default:
        return false;
    }
  }
  const uint8_t k = cpt_class(c);
  return !(k & unicode::kWhitespace) && (k & unicode::kPunctuation);
}

// One segment [ini, end) of the code points, with llama.cpp's custom-splitter conventions: reading
// outside the segment yields kOut (code point) / no flags, and tokens are emitted by end position.
class Segment {
 public:
  static constexpr uint32_t kOut = 0xFFFFFFFF;
  Segment(std::span<const uint32_t> cpts, size_t ini, size_t end, std::vector<size_t>& out)
      : cpts_(cpts), ini_(ini), end_(end), prev_end_(ini), out_(out) {}

  uint32_t cpt(size_t pos) const { return pos >= ini_ && pos < end_ ? cpts_[pos] : kOut; }
  bool in(size_t pos) const { return pos >= ini_ && pos < end_; }
  bool is_letter(size_t pos) const { return in(pos) && (cpt_class(cpts_[pos]) & unicode::kLetter); }
  bool is_number(size_t pos) const { return in(pos) && (cpt_class(cpts_[pos]) & unicode::kNumber); }
  bool is_space(size_t pos) const { return in(pos) && (cpt_class(cpts_[pos]) & unicode::kWhitespace); }
  // [^\s\p{L}\p{N}] inside the segment.
  bool is_other(size_t pos) const {
    return in(pos) && !(cpt_class(cpts_[pos]) & (unicode::kWhitespace | unicode::kLetter | unicode::kNumber));
  }
  size_t add(size_t end) {
    const size_t len = end - prev_end_;
    if (len > 0) out_.push_back(len);
    prev_end_ = end;
    return len;
  }
  size_t ini() const { return ini_; }
  size_t end() const { return end_; }

 private:
  std::span<const uint32_t> cpts_;
  size_t ini_, end_, prev_end_;
  std::vector<size_t>& out_;
};

uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// Returns the contraction's length at pos ('s 't 'm 'd: 2, 're 've 'll: 3), or 0.
size_t contraction(const Segment& s, size_t pos, bool ignore_case) {
  if (s.cpt(pos) != '\'' || pos + 1 >= s.end()) return 0;
  auto low = [&](uint32_t c) { return ignore_case ? ascii_lower(c) : c; };
  const uint32_t c1 = low(s.cpt(pos + 1));
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 < s.end()) {
    const uint32_t c2 = low(s.cpt(pos + 2));
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  }
  return 0;
}

void split_gpt2(Segment& s) {
  for (size_t pos = s.ini(); pos < s.end();) {
    const uint32_t c = s.cpt(pos);
    if (const size_t n = contraction(s, pos, false)) {
      pos += s.add(pos + n);
      continue;
    }
    const size_t p2 = c == ' ' ? pos + 1 : pos;  // the optional leading space
    if (s.is_letter(p2)) {
      pos = p2;
      while (s.is_letter(pos)) ++pos;
      s.add(pos);
      continue;
    }
    if (s.is_number(p2)) {
      pos = p2;
      while (s.is_number(pos)) ++pos;
      s.add(pos);
      continue;
    }
    if (s.is_other(p2)) {
      pos = p2;
      while (s.is_other(pos)) ++pos;
      s.add(pos);
      continue;
    }
    size_t n_ws = 0;
    while (s.is_space(pos + n_ws)) ++n_ws;
    if (n_ws > 1 && s.in(pos + n_ws)) {  // \s+(?!\S): leave the last space to the next word
      pos += n_ws - 1;
      s.add(pos);
      continue;
    }
    if (n_ws > 0) {
      pos += n_ws;
      s.add(pos);
      continue;
    }
    s.add(++pos);
  }
}

void split_llama3(Segment& s, size_t max_digits) {
  for (size_t pos = s.ini(); pos < s.end();) {
    const uint32_t c = s.cpt(pos);
    if (const size_t n = contraction(s, pos, true)) {
      pos += s.add(pos + n);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!(c == '\r' || c == '\n' || s.is_number(pos))) {
      if (s.is_letter(pos) || s.is_letter(pos + 1)) {
        ++pos;
        while (s.is_letter(pos)) ++pos;
        s.add(pos);
        continue;
      }
    }
    // \p{N}{1,max_digits}
    if (s.is_number(pos)) {
      size_t ini = pos;
      while (s.is_number(pos)) {
        if (++pos - ini >= max_digits) {
          s.add(pos);
          ini = pos;
        }
      }
      s.add(pos);
      continue;
    }
    // <space>?[^\s\p{L}\p{N}]+[\r\n]*
    const size_t p2 = c == ' ' ? pos + 1 : pos;
    if (s.is_other(p2)) {
      pos = p2;
      while (s.is_other(pos)) ++pos;
      while (s.cpt(pos) == '\r' || s.cpt(pos) == '\n') ++pos;
      s.add(pos);
      continue;
    }
    size_t n_ws = 0;
    size_t last_rn_end = 0;
    while (s.is_space(pos + n_ws)) {
      const uint32_t c2 = s.cpt(pos + n_ws);
      if (c2 == '\r' || c2 == '\n') last_rn_end = pos + n_ws + 1;
      ++n_ws;
    }
    if (last_rn_end > 0) {  // \s*[\r\n]+
      pos = last_rn_end;
      s.add(pos);
      continue;
    }
    if (n_ws > 1 && s.in(pos + n_ws)) {  // \s+(?!\S)
      pos += n_ws - 1;
      s.add(pos);
      continue;
    }
    if (n_ws > 0) {
      pos += n_ws;
      s.add(pos);
      continue;
    }
    s.add(++pos);
  }
}

// Matches of `pred` runs (each at most `max_run` long) become segments; the text between them too.
template <typename Pred>
void split_runs(Segment& s, Pred pred, size_t max_run, std::span<const uint32_t> cpts) {
  size_t pos = s.ini();
  while (pos < s.end()) {
    if (!pred(cpts[pos])) {
      ++pos;
      continue;
    }
    s.add(pos);
    const size_t start = pos;
    while (pos < s.end() && pos - start < max_run && pred(cpts[pos])) ++pos;
    s.add(pos);
  }
  s.add(s.end());
}

void split_ascii_digits3(Segment& s, std::span<const uint32_t> cpts) {
  auto digit = [&](size_t p) { return p < s.end() && cpts[p] >= '0' && cpts[p] <= '9'; };
  size_t pos = s.ini();
  while (pos < s.end()) {
    if (digit(pos) && digit(pos + 1) && digit(pos + 2)) {
      s.add(pos);
      pos += 3;
      s.add(pos);
    } else {
      ++pos;
    }
  }
  s.add(s.end());
}

}  // namespace

void split(std::span<const Step> steps, std::span<const uint32_t> cpts, std::vector<size_t>& lengths) {
  lengths.clear();
  if (cpts.empty()) return;
  lengths.push_back(cpts.size());
  std::vector<size_t> next;
  for (const Step step : steps) {
    next.clear();
    next.reserve(lengths.size() * 2);
    size_t start = 0;
    for (const size_t len : lengths) {
      Segment s(cpts, start, start + len, next);
      switch (step) {
        case Step::kGpt2: split_gpt2(s); break;
        case Step::kLlama3: split_llama3(s, 3); break;
        case Step::kQwen2: split_llama3(s, 1); break;
        case Step::kEachNumber: split_runs(s, regex_is_number, 1, cpts); break;
        case Step::kNumberRuns: split_runs(s, regex_is_number, SIZE_MAX, cpts); break;
        case Step::kPunctRuns:
          split_runs(s, [](uint32_t c) { return regex_is_punct(c, false); }, SIZE_MAX, cpts);
          break;
        case Step::kPunctRunsTick:
          split_runs(s, [](uint32_t c) { return regex_is_punct(c, true); }, SIZE_MAX, cpts);
          break;
        case Step::kAsciiDigits3: split_ascii_digits3(s, cpts); break;
      }
      start += len;
    }
    lengths.swap(next);
  }
}

}  // namespace inferd::pretok
