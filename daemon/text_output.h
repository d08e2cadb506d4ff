// daemon/text_output.h — the text a generation streams: valid UTF-8, stop strings cut.
//
// Token pieces go in one at a time; what comes out is the text that can be sent now. Pieces are bytes
// (a byte-fallback token is a single byte of a character, and a sampled model can put bytes together that
// make no character), so the output is decoded as it goes: every ill-formed sequence becomes U+FFFD (one
// per maximal subpart, as Unicode §3.9 and the WHATWG decoder substitute), and the bytes of a character
// not yet complete wait for the next piece. Stop strings are matched against that decoded text — the text
// the client receives — so a stop string can never reach a client, not even through a U+FFFD. Text that
// could still be the beginning of a stop string is held back until the next piece decides it. When a stop
// string appears, the text before it is released and stopped() becomes true; the stop string itself and
// anything after it are never released. Stop strings must be valid UTF-8 (the scheduler refuses others).
// Thread safety: a value; one thread at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace inferd::daemon {

// True if `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view s);

class TextOutput {
 public:
  explicit TextOutput(std::vector<std::string> stop = {});
  std::string push(std::string_view piece);
  // The held-back text at the end of a generation (an incomplete UTF-8 tail becomes U+FFFD).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  // Cuts `held_` at the earliest stop string, if any: returns true and sets `out` to the text before it.
  bool cut_at_stop(std::string* out);

  std::vector<std::string> stop_;
  std::string pending_;  // the first bytes of a character not yet complete (at most 3)
  std::string held_;     // decoded text not yet released
  bool stopped_ = false;
};

}  // namespace inferd::daemon
