// UTF-8 and Unicode helpers (unicode.h).
#include "unicode.h"

namespace kolos::tokenizer::hf {

size_t char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

uint32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  *len = char_length(c);
  if (*len == 1) return c;
  uint32_t cp = c & (0x7F >> *len);
  for (size_t k = 1; k < *len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Unicode White_Space (what Rust's regex `\s` matches).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Start of the run of white space that ends `s` (s.size() when none).
size_t trailing_space_start(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t i = start - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t len = 0;
    if (!is_white_space(decode_at(s, i, &len))) break;
    start = i;
  }
  return start;
}

// Length of the run of white space that starts `s`.
size_t leading_space_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    if (!is_white_space(decode_at(s, i, &len))) break;
    i += len;
  }
  return i;
}

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

}  // namespace kolos::tokenizer::hf
