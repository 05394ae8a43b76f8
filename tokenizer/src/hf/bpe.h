// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): one
// pre-token (a word) to ids, by merges applied lowest rank first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kolos/tokenizer/tokenizer.h"

namespace kolos::tokenizer::hf {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;  // "" for none
  std::string end_of_word_suffix;         // "" for none
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `vocab`: token -> id; `merges`: pairs in rank order. Throws
  // kolos::DataError naming `where` (file and JSON path) when a merge names
  // a token that is not in the vocabulary (either side, or their
  // concatenation), or when the unknown token is not in it.
  BpeModel(std::vector<std::pair<std::string, TokenId>> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& where);

  // Appends the ids of `word` (non-empty, valid UTF-8) to `out`.
  void tokenize(std::string_view word, std::vector<TokenId>* out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  // nullptr when `id` is not in the vocabulary.
  const std::string* id_to_token(TokenId id) const;
  // One more than the largest id.
  int64_t id_bound() const { return static_cast<int64_t>(by_id_.size()); }

 private:
  struct Merge {
    uint32_t rank;
    TokenId new_id;
  };
  static uint64_t pair_key(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::vector<std::string> tokens_;  // owns the strings `ids_` views
  std::vector<int32_t> by_id_;       // id -> index into tokens_, -1 for a hole
  std::unordered_map<std::string_view, TokenId> ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  BpeOptions options_;
  std::optional<TokenId> unk_id_;
  TokenId byte_ids_[256];  // <0xXX> tokens for byte fallback; -1 when absent
};

}  // namespace kolos::tokenizer::hf
