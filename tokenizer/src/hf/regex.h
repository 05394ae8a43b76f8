// A PCRE2 regular expression (UTF-8, Unicode properties, JIT-compiled) as
// the pre-tokenizers use it. Owned and move-only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "json_reader.h"

struct pcre2_real_code_8;

namespace kolos::tokenizer::hf {

class Regex {
 public:
  // Compiles `pattern` with PCRE2_UTF | PCRE2_UCP and JIT. The pattern is
  // the one tokenizer.json gives (Oniguruma syntax in the Rust package); its
  // `\s` and `\S` are widened to Unicode White_Space as Oniguruma has it
  // (translate_pattern()). Throws kolos::DataError naming `where` (the file
  // and JSON path) and PCRE2's message with the offset.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [start, end) of the successive non-overlapping matches in
  // `text` (valid UTF-8), appended to `out`. As Oniguruma's find_iter: an
  // empty match right where the previous match ended is skipped and the
  // search resumes one character further. Thread-safe.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
};

// A pattern that matches `literal` exactly (a Split's or Replace's
// {"String": ...}).
std::string escape_regex(const std::string& literal);

// The pattern of a Split's or Replace's "pattern" key of `object`:
// {"Regex": "..."} as written, {"String": "..."} escaped (escape_regex).
// Refuses anything else, naming `where`.pattern.
std::string read_pattern(const Json& object, const Where& where);

// The PCRE2 spelling of an Oniguruma pattern: `\s` (and `\S`, and `\s`
// inside a class) also match U+0085 and leave out U+180E, which Oniguruma's
// and Rust's Unicode White_Space do and PCRE2 10.42's `\s` does not.
std::string translate_pattern(const std::string& pattern);

}  // namespace kolos::tokenizer::hf
