// PCRE2 behind hf::Regex.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <pcre2.h>

#include <cctype>
#include <memory>

#include "kolos/core/error.h"
#include "unicode.h"

namespace kolos::tokenizer::hf {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(code)
               : std::string(reinterpret_cast<char*>(buffer));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

// White_Space as Oniguruma's Unicode tables have it, in PCRE2 class syntax:
// PCRE2's \s without U+180E, plus U+0085.
constexpr char kSpaceClassBody[] =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

}  // namespace

std::string escape_regex(const std::string& literal) {
  std::string out;
  for (const char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    // A backslash before a non-alphanumeric character always means itself.
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

std::string translate_pattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 's') {
        out += in_class ? std::string(kSpaceClassBody) : "[" + std::string(kSpaceClassBody) + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + std::string(kSpaceClassBody) + "]";
      } else {
        // \S inside a class has no simple class-body spelling; PCRE2's own
        // \S differs from Oniguruma's only on U+0085 and U+180E.
        out += c;
        out += next;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& where) {
  const std::string translated = translate_pattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code_ == nullptr) {
    throw DataError(where + ": cannot compile the regex \"" + pattern +
                    "\": " + pcre2_message(error) + " (at offset " + std::to_string(offset) +
                    " of its PCRE2 form \"" + translated + "\")");
  }
  // JIT is an optimisation: where it is unavailable pcre2_match interprets.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(code_);
}

Regex::Regex(Regex&& other) noexcept : code_(std::exchange(other.code_, nullptr)) {}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    if (code_ != nullptr) pcre2_code_free(code_);
    code_ = std::exchange(other.code_, nullptr);
  }
  return *this;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create(4, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  size_t last_end = static_cast<size_t>(-1);
  while (start <= text.size()) {
    const int rc =
        pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      throw Error("regex match failed: " + pcre2_message(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t s = ovector[0], e = ovector[1];
    if (s == e && e == last_end) {
      // Skip an empty match where the previous one ended.
      if (s >= text.size()) return;
      start = s + char_length(static_cast<unsigned char>(text[s]));
      continue;
    }
    out->emplace_back(s, e);
    last_end = e;
    if (s == e) {
      if (e >= text.size()) return;
      start = e + char_length(static_cast<unsigned char>(text[e]));
    } else {
      start = e;
    }
  }
}

std::string read_pattern(const Json& object, const Where& where) {
  const Where at = where.key("pattern");
  const auto it = object.find("pattern");
  if (it == object.end() || !it->is_object() || it->size() != 1) {
    at.fail("must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
  }
  if (const auto regex = get_string(*it, "Regex", at)) return *regex;
  if (const auto literal = get_string(*it, "String", at)) return escape_regex(*literal);
  at.fail("must be {\"Regex\": \"...\"} or {\"String\": \"...\"}, found " + short_dump(*it));
}

}  // namespace kolos::tokenizer::hf
