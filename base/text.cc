#include "base/text.h"

#include "absl/strings/str_format.h"

namespace remat {

std::string QuoteForMessage(std::string_view text, std::size_t max) {
  const bool cut = text.size() > max;
  std::string out = "'";
  for (const char c : text.substr(0, max)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", byte);
    }
  }
  out += cut ? "...'" : "'";
  return out;
}

}  // namespace remat
