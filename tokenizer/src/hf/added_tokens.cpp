// Added-token matching (added_tokens.h).
#include "added_tokens.h"

#include <algorithm>

#include "regex.h"
#include "unicode.h"

namespace kolos::tokenizer::hf {
namespace {

class WordRegex {
 public:
  WordRegex() : regex_("\\w", "the added tokens' single_word check") {}
  bool is_word_char(std::string_view ch) const {
    std::vector<std::pair<size_t, size_t>> found;
    regex_.find_all(ch, &found);
    return !found.empty();
  }

 private:
  Regex regex_;
};

const WordRegex& word_regex() {
  static const WordRegex regex;
  return regex;
}

}  // namespace

void split_on_added(const std::string& text, const AddedMatcher& matcher,
                    std::vector<Segment>* out) {
  if (matcher.empty() || text.empty()) {
    if (!text.empty()) out->push_back({text, std::nullopt});
    return;
  }
  size_t start_offset = 0;
  for (const auto& hit : matcher.find_all(text)) {
    size_t start = hit.start, stop = hit.end;
    const AddedToken& token = *hit.token;
    if (token.single_word) {
      bool before_ok = true, after_ok = true;
      if (start > 0) {
        size_t i = start - 1;
        while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
        before_ok = !word_regex().is_word_char(std::string_view(text).substr(i, start - i));
      }
      if (stop < text.size()) {
        const size_t len = char_length(static_cast<unsigned char>(text[stop]));
        after_ok = !word_regex().is_word_char(std::string_view(text).substr(stop, len));
      }
      if (!before_ok || !after_ok) continue;
    }
    if (token.lstrip) {
      start = std::max(trailing_space_start(std::string_view(text).substr(0, start)), start_offset);
    }
    if (token.rstrip) stop += leading_space_length(std::string_view(text).substr(stop));
    if (start_offset < start)
      out->push_back({text.substr(start_offset, start - start_offset), std::nullopt});
    out->push_back({text.substr(start, stop - start), token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({text.substr(start_offset), std::nullopt});
}

}  // namespace kolos::tokenizer::hf
