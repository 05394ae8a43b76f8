// UTF-8 and Unicode helpers of the tokenizer.json pipeline. The strings
// they take are valid UTF-8 (encode() repairs its input first).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kolos::tokenizer::hf {

// Bytes of the character whose first byte is `lead`.
size_t char_length(unsigned char lead);
// The code point at s[i]; its length in *len.
uint32_t decode_at(std::string_view s, size_t i, size_t* len);
void append_utf8(uint32_t cp, std::string* out);
// Unicode White_Space (what Rust's regex `\s` matches).
bool is_white_space(uint32_t cp);
// Start of the run of white space that ends `s` (s.size() when none).
size_t trailing_space_start(std::string_view s);
// Length of the run of white space that starts `s`.
size_t leading_space_length(std::string_view s);

// GPT-2's byte <-> printable character table (bytes_to_unicode): the
// printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100 onwards in byte order.
struct ByteTable {
  std::array<std::string, 256> byte_to_char;
  std::unordered_map<uint32_t, uint8_t> char_to_byte;
  ByteTable() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      append_utf8(cp, &byte_to_char[static_cast<size_t>(b)]);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteTable& byte_table();

}  // namespace kolos::tokenizer::hf
