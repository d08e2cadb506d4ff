// daemon/text_output.h — the text a generation streams: complete UTF-8, stop strings cut.
//
// Token pieces go in one at a time; what comes out is the text that can be sent now. Text that could
// still turn out to be the beginning of a stop string, or an incomplete UTF-8 sequence, is held back
// until the next piece decides it. When a stop string appears, the text before it is released and
// stopped() becomes true; the stop string itself and anything after it are never released.
// Thread safety: a value; one thread at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace inferd::daemon {

class TextOutput {
 public:
  explicit TextOutput(std::vector<std::string> stop = {});
  std::string push(std::string_view piece);
  // The held-back text at the end of a generation (an incomplete UTF-8 tail becomes U+FFFD).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace inferd::daemon
