// Pre-tokenizers (pre_tokenizer.h). Splitting follows the Rust package's
// NormalizedString::split: the regex's matches and the text between them
// are spans; the behaviour keeps, drops or merges the matches.
#include "pre_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "regex.h"
#include "unicode.h"

namespace kolos::tokenizer::hf {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const Json& object, const Where& where) {
  const auto value = get_string(object, "behavior", where);
  if (!value) where.key("behavior").fail("is missing");
  static const std::vector<std::pair<std::string, Behavior>> kNames = {
      {"Removed", Behavior::kRemoved},
      {"Isolated", Behavior::kIsolated},
      {"MergedWithPrevious", Behavior::kMergedWithPrevious},
      {"MergedWithNext", Behavior::kMergedWithNext},
      {"Contiguous", Behavior::kContiguous}};
  std::vector<std::string> names;
  for (const auto& [name, behavior] : kNames) {
    if (*value == name) return behavior;
    names.push_back(name);
  }
  where.key("behavior").fail("= \"" + *value + "\" is not supported; supported: " + join(names));
}

// Splits `piece` at the matches of `regex` (or at the non-matches when
// `invert`), keeping or merging the matches as `behavior` says; appends the
// non-empty results to `out`.
void split_piece(const std::string& piece, const Regex& regex, Behavior behavior, bool invert,
                 Pieces* out) {
  struct Span {
    size_t start, end;
    bool match;
  };
  std::vector<std::pair<size_t, size_t>> found;
  regex.find_all(piece, &found);
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [s, e] : found) {
    if (prev != s) spans.push_back({prev, s, invert});
    spans.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != piece.size()) spans.push_back({prev, piece.size(), invert});

  std::vector<std::pair<size_t, size_t>> kept;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Span& s : spans) kept.emplace_back(s.start, s.end);
      break;
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.match) kept.emplace_back(s.start, s.end);
      }
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const Span& s : spans) {
        if (s.match == previous && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.start, s.end);
        }
        previous = s.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Span& s : spans) {
        if (s.match && !previous && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.start, s.end);
        }
        previous = s.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous && !kept.empty()) {
          kept.back().first = it->start;
        } else {
          kept.emplace_back(it->start, it->end);
        }
        previous = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const auto& [s, e] : kept) {
    if (e > s) out->push_back(piece.substr(s, e - s));
  }
}

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex, const Where& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_.emplace(kGpt2Pattern, where.str() + " (ByteLevel's GPT-2 regex)");
  }
  void apply(Pieces* pieces) const override {
    Pieces split;
    for (std::string& piece : *pieces) {
      if (add_prefix_space_ && (piece.empty() || piece[0] != ' ')) piece.insert(0, " ");
      if (regex_) {
        split_piece(piece, *regex_, Behavior::kIsolated, false, &split);
      } else if (!piece.empty()) {
        split.push_back(std::move(piece));
      }
    }
    const ByteTable& table = byte_table();
    for (std::string& piece : split) {
      std::string mapped;
      mapped.reserve(piece.size() * 2);
      for (const char c : piece) mapped += table.byte_to_char[static_cast<unsigned char>(c)];
      piece = std::move(mapped);
    }
    *pieces = std::move(split);
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

class SplitPre : public PreTokenizer {
 public:
  SplitPre(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void apply(Pieces* pieces) const override {
    Pieces split;
    for (const std::string& piece : *pieces) split_piece(piece, regex_, behavior_, invert_, &split);
    *pieces = std::move(split);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class SequencePre : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void apply(Pieces* pieces) const override {
    for (const auto& step : steps_) step->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Json& j, const Where& where) {
  const std::string type = get_type(j, where);
  if (type == "ByteLevel") {
    check_keys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<ByteLevelPre>(get_bool(j, "add_prefix_space", where, true),
                                          get_bool(j, "use_regex", where, true), where);
  }
  if (type == "Split") {
    check_keys(j, where, {"type", "pattern", "behavior", "invert"});
    const std::string pattern = read_pattern(j, where);
    return std::make_unique<SplitPre>(Regex(pattern, where.key("pattern").str()),
                                      parse_behavior(j, where),
                                      get_bool(j, "invert", where, false));
  }
  if (type == "Digits") {
    check_keys(j, where, {"type", "individual_digits"});
    const bool individual = get_bool(j, "individual_digits", where, false);
    return std::make_unique<SplitPre>(Regex("\\p{N}", where.str()),
                                      individual ? Behavior::kIsolated : Behavior::kContiguous,
                                      false);
  }
  if (type == "Sequence") {
    check_keys(j, where, {"type", "pretokenizers"});
    const auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) where.key("pretokenizers").fail("must be a list");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      steps.push_back(parse_pre_tokenizer((*it)[i], where.key("pretokenizers").index(i)));
    }
    return std::make_unique<SequencePre>(std::move(steps));
  }
  unsupported_type(where, type, {"ByteLevel", "Split", "Digits", "Sequence"});
}

}  // namespace kolos::tokenizer::hf
