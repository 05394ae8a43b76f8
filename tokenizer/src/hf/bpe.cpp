// BPE merges, with the semantics of the Rust `tokenizers` package
// (models/bpe): the initial symbols are the word's characters (with the
// continuing-subword prefix and end-of-word suffix where configured); a
// character missing from the vocabulary becomes its <0xXX> byte tokens under
// byte fallback, else the unknown token (fused with a preceding unknown when
// fuse_unk); then the adjacent pair of lowest merge rank is merged, the
// leftmost among equals, until no adjacent pair has a merge.
#include "bpe.h"

#include <cstdio>
#include <queue>

#include "kolos/core/error.h"
#include "unicode.h"

namespace kolos::tokenizer::hf {
namespace {

struct Symbol {
  TokenId id;
  int prev;
  int next;
  bool live;
};

struct Candidate {
  uint32_t rank;
  int pos;
  TokenId new_id;
  // std::priority_queue pops the largest: lowest rank, then leftmost, first.
  bool operator<(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

}  // namespace

BpeModel::BpeModel(std::vector<std::pair<std::string, TokenId>> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& where)
    : options_(std::move(options)) {
  tokens_.reserve(vocab.size());
  TokenId max_id = -1;
  for (auto& [token, id] : vocab) {
    if (id < 0) {
      throw DataError(where + ".vocab[\"" + token + "\"] = " + std::to_string(id) +
                      " is negative; ids are 0 or more");
    }
    max_id = std::max(max_id, id);
    tokens_.push_back(std::move(token));
  }
  by_id_.assign(static_cast<size_t>(max_id + 1), -1);
  ids_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const TokenId id = vocab[i].second;
    ids_[tokens_[i]] = id;
    by_id_[static_cast<size_t>(id)] = static_cast<int32_t>(i);
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto id = token_to_id(name);
    byte_ids_[b] = id ? *id : -1;
  }
  if (options_.unk_token) {
    unk_id_ = token_to_id(*options_.unk_token);
    if (!unk_id_) {
      throw DataError(where + ".unk_token = \"" + *options_.unk_token +
                      "\" is not in the vocabulary (" + where + ".vocab)");
    }
  }
  const size_t prefix_len = options_.continuing_subword_prefix.size();
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const std::string at = where + ".merges[" + std::to_string(rank) + "]";
    const auto a_id = token_to_id(a);
    const auto b_id = token_to_id(b);
    if (!a_id || !b_id) {
      throw DataError(at + " = [\"" + a + "\", \"" + b + "\"] names \"" + (a_id ? b : a) +
                      "\", which is not in the vocabulary (" + where + ".vocab)");
    }
    if (b.size() < prefix_len) {
      throw DataError(at + ": \"" + b + "\" is shorter than continuing_subword_prefix");
    }
    const std::string merged = a + b.substr(prefix_len);
    const auto new_id = token_to_id(merged);
    if (!new_id) {
      throw DataError(at + " = [\"" + a + "\", \"" + b + "\"] makes \"" + merged +
                      "\", which is not in the vocabulary (" + where + ".vocab)");
    }
    // A repeated pair keeps its last rank, as the Rust package's map does.
    merges_[pair_key(*a_id, *b_id)] = Merge{static_cast<uint32_t>(rank), *new_id};
  }
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= by_id_.size() || by_id_[static_cast<size_t>(id)] < 0) {
    return nullptr;
  }
  return &tokens_[static_cast<size_t>(by_id_[static_cast<size_t>(id)])];
}

void BpeModel::tokenize(std::string_view word, std::vector<TokenId>* out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = token_to_id(word)) {
      out->push_back(*id);
      return;
    }
  }
  // The initial symbols.
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](TokenId id) {
    const int n = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1, true});
  };
  std::optional<TokenId> pending_unk;
  std::string scratch;
  const bool affixes =
      !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::min(char_length(static_cast<unsigned char>(word[i])), word.size() - i);
    std::string_view piece = word.substr(i, len);
    const bool first = i == 0;
    i += len;
    const bool last = i >= word.size();
    if (affixes) {
      scratch.clear();
      if (!first) scratch += options_.continuing_subword_prefix;
      scratch.append(piece.data(), piece.size());
      if (last) scratch += options_.end_of_word_suffix;
      piece = scratch;
    }
    if (const auto id = token_to_id(piece)) {
      if (pending_unk) add(*std::exchange(pending_unk, std::nullopt));
      add(*id);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (const char c : piece) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // As the Rust package: a pending unknown is not flushed here.
        for (const char c : piece) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !options_.fuse_unk) add(*pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk) add(*pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::priority_queue<Candidate> queue;
  auto push = [&](int pos) {
    const int next = symbols[static_cast<size_t>(pos)].next;
    if (next < 0) return;
    const auto it = merges_.find(
        pair_key(symbols[static_cast<size_t>(pos)].id, symbols[static_cast<size_t>(next)].id));
    if (it != merges_.end()) queue.push(Candidate{it->second.rank, pos, it->second.new_id});
  };
  for (int pos = 0; pos + 1 < static_cast<int>(symbols.size()); ++pos) push(pos);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.live || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    // A stale entry: the pair at pos changed since it was queued.
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.live = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.live) out->push_back(s.id);
  }
}

}  // namespace kolos::tokenizer::hf
