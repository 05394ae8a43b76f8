// tokenizer.json "added_tokens": matched in the text before it is
// pre-tokenized, as the Rust package's AddedVocabulary does.
#pragma once

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kolos/tokenizer/tokenizer.h"

namespace kolos::tokenizer::hf {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  std::string pattern;  // what is matched: the content, normalized when `normalized`
};

// Leftmost-longest matching of a set of added tokens (the Rust package uses
// an Aho-Corasick automaton with that match kind; the few hundred tokens a
// tokenizer has are bucketed here by first byte).
class AddedMatcher {
 public:
  void add(const AddedToken* token) {
    if (token->pattern.empty()) return;
    auto& bucket = by_first_[static_cast<unsigned char>(token->pattern[0])];
    bucket.push_back(token);
    // Longest first: the first hit at a position is the longest.
    std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->pattern.size() > b->pattern.size();
    });
    empty_ = false;
  }
  bool empty() const { return empty_; }

  struct Hit {
    size_t start, end;
    const AddedToken* token;
  };
  // Successive non-overlapping leftmost-longest matches.
  std::vector<Hit> find_all(std::string_view text) const {
    std::vector<Hit> hits;
    for (size_t i = 0; i < text.size();) {
      const AddedToken* best = nullptr;
      for (const AddedToken* token : by_first_[static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, token->pattern.size(), token->pattern) == 0) {
          best = token;
          break;
        }
      }
      if (best == nullptr) {
        ++i;
        continue;
      }
      hits.push_back({i, i + best->pattern.size(), best});
      i += best->pattern.size();
    }
    return hits;
  }

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_;
  bool empty_ = true;
};

// A piece of the input: an added token's id, or text still to pre-tokenize.
struct Segment {
  std::string text;
  std::optional<TokenId> id;
};

// Splits `text` at the matches of `matcher` (AddedVocabulary::find_matches):
// leftmost-longest matches, a single_word token skipped where a word
// character touches it, lstrip / rstrip taking the white space around into
// the token. Appends the pieces, each an added token's id or plain text, to
// `out`.
void split_on_added(const std::string& text, const AddedMatcher& matcher,
                    std::vector<Segment>* out);

}  // namespace kolos::tokenizer::hf
