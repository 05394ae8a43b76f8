// UTF-8 repair with the replacement policy of Python's and Rust's lossy
// decoders (tokenizer.h, to_valid_utf8()).
#include <cstddef>
#include <string>
#include <string_view>

#include "kolos/tokenizer/tokenizer.h"

namespace kolos::tokenizer {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

bool in(unsigned char c, unsigned char lo, unsigned char hi) { return c >= lo && c <= hi; }

// Length of the well-formed sequence starting at s[i] (1..4), or, negated,
// the length of the maximal ill-formed subpart to replace by one U+FFFD.
// Table 3-7 of the Unicode standard ("Well-Formed UTF-8 Byte Sequences"):
// the second byte's range depends on the lead byte; later bytes are 80..BF.
int sequence_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (in(c, 0xC2, 0xDF)) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if (in(c, 0xE1, 0xEC) || in(c, 0xEE, 0xEF)) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (in(c, 0xF1, 0xF3)) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return -1;  // 80..C1, F5..FF: never a lead byte
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return -k;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? in(b, lo, hi) : in(b, 0x80, 0xBF);
    if (!ok) return -k;
  }
  return need + 1;
}

}  // namespace

std::string to_valid_utf8(std::string_view bytes) {
  size_t i = 0;
  // Fast path: most text is valid; copy it once.
  while (i < bytes.size()) {
    const int n = sequence_length(bytes, i);
    if (n < 0) break;
    i += static_cast<size_t>(n);
  }
  if (i == bytes.size()) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 16);
  out.append(bytes.data(), i);
  while (i < bytes.size()) {
    const int n = sequence_length(bytes, i);
    if (n > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out.append(kReplacement);
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

}  // namespace kolos::tokenizer
