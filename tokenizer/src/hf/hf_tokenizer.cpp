// Hugging Face tokenizer.json with a BPE model (tokenizer.h).
//
// The encoding pipeline, as the Rust `tokenizers` package runs it for one
// sequence:
//   1. added tokens: the text is split on the added tokens that are not
//      "normalized" (leftmost-longest matches; lstrip / rstrip / single_word
//      honoured);
//      the normalizer (Unicode NFC / NFD / NFKC / NFKD through ICU) runs on
//      the pieces between, then they are split on the "normalized" ones; a
//      matched added token is one id and is not pre-tokenized;
//   2. the pre-tokenizer splits each remaining piece further (Split with a
//      regex, ByteLevel's GPT-2 regex, Digits, a Sequence of them); ByteLevel
//      also maps every byte of a piece to its printable character;
//   3. the BPE model turns each piece into ids (bpe.cpp);
//   4. the post-processor (TemplateProcessing) adds its special tokens.
// Decoding maps ids to token strings (added tokens by content), drops special
// tokens when asked, and runs the decoder chain.
//
// Loading checks every key: an unknown key or an unsupported type or value
// is refused with its JSON path ("tokenizer.json: normalizer.type = ...").
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <unordered_map>

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <nlohmann/json.hpp>

#include "bpe.h"
#include "kolos/core/error.h"
#include "kolos/tokenizer/tokenizer.h"
#include "regex.h"

namespace kolos::tokenizer {
namespace hf {
namespace {

using Json = nlohmann::json;
using Pieces = std::vector<std::string>;

// ---- reading the file -------------------------------------------------------

// Where a value sits: the file and the JSON path, for error messages.
class Where {
 public:
  Where(std::string file, std::string path) : file_(std::move(file)), path_(std::move(path)) {}
  Where key(const std::string& k) const { return {file_, path_.empty() ? k : path_ + "." + k}; }
  Where index(size_t i) const { return {file_, path_ + "[" + std::to_string(i) + "]"}; }
  // "tokenizer.json: model.merges[3]"
  std::string str() const { return file_ + ": " + (path_.empty() ? "(top level)" : path_); }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& what) const { throw DataError(str() + " " + what); }

 private:
  std::string file_;
  std::string path_;
};

std::string short_dump(const Json& j) {
  std::string s = j.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

// Refuses keys of `object` outside `known`.
void check_keys(const Json& object, const Where& where, const std::vector<std::string>& known) {
  if (!object.is_object()) where.fail("must be an object, found " + short_dump(object));
  for (const auto& item : object.items()) {
    if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
      where.key(item.key())
          .fail("is not supported (value " + short_dump(item.value()) +
                "); supported keys here: " + join(known));
    }
  }
}

bool get_bool(const Json& object, const char* key, const Where& where, bool fallback) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) where.key(key).fail("must be true or false, found " + short_dump(*it));
  return it->get<bool>();
}

std::optional<std::string> get_string(const Json& object, const char* key, const Where& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) where.key(key).fail("must be a string, found " + short_dump(*it));
  return it->get<std::string>();
}

std::string get_type(const Json& object, const Where& where) {
  if (!object.is_object()) where.fail("must be an object, found " + short_dump(object));
  const auto type = get_string(object, "type", where);
  if (!type) where.key("type").fail("is missing");
  return *type;
}

[[noreturn]] void unsupported_type(const Where& where, const std::string& type,
                                   const std::vector<std::string>& supported) {
  where.key("type").fail("= \"" + type + "\" is not supported; supported: " + join(supported));
}

// ---- UTF-8 and Unicode helpers -----------------------------------------------

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

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

// ---- splitting (NormalizedString::split) ------------------------------------

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

// A regex that matches `literal` exactly.
std::string escape_literal(const std::string& literal) {
  std::string out;
  for (const char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

// ---- normalizers ---------------------------------------------------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(const std::string& text) const = 0;
};

// Unicode normalization forms through ICU's Normalizer2 (UTF-8 in and out).
class UnicodeNormalizer : public Normalizer {
 public:
  UnicodeNormalizer(const std::string& form, const Where& where) : form_(form) {
    UErrorCode status = U_ZERO_ERROR;
    if (form == "NFC") {
      normalizer_ = icu::Normalizer2::getNFCInstance(status);
    } else if (form == "NFD") {
      normalizer_ = icu::Normalizer2::getNFDInstance(status);
    } else if (form == "NFKC") {
      normalizer_ = icu::Normalizer2::getNFKCInstance(status);
    } else {
      normalizer_ = icu::Normalizer2::getNFKDInstance(status);
    }
    if (U_FAILURE(status) || normalizer_ == nullptr) {
      where.fail("= \"" + form + "\": ICU cannot provide it: " + u_errorName(status));
    }
  }
  std::string apply(const std::string& text) const override {
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
    if (normalizer_->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return text;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
    normalizer_->normalizeUTF8(0, piece, sink, nullptr, status);
    if (U_FAILURE(status)) {
      throw Error("Unicode " + form_ + " normalization failed: " + u_errorName(status));
    }
    return out;
  }

 private:
  std::string form_;
  const icu::Normalizer2* normalizer_ = nullptr;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string apply(const std::string& text) const override {
    std::string out = text;
    for (const auto& step : steps_) out = step->apply(out);
    return out;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// nullptr for the identity (an empty Sequence).
std::unique_ptr<Normalizer> parse_normalizer(const Json& j, const Where& where) {
  const std::string type = get_type(j, where);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    check_keys(j, where, {"type"});
    return std::make_unique<UnicodeNormalizer>(type, where.key("type"));
  }
  if (type == "Sequence") {
    check_keys(j, where, {"type", "normalizers"});
    const auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) where.key("normalizers").fail("must be a list");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      auto step = parse_normalizer((*it)[i], where.key("normalizers").index(i));
      if (step) steps.push_back(std::move(step));
    }
    if (steps.empty()) return nullptr;
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  unsupported_type(where, type, {"NFC", "NFD", "NFKC", "NFKD", "Sequence"});
}

// ---- pre-tokenizers -----------------------------------------------------------

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokenization.
  virtual void apply(Pieces* pieces) const = 0;
};

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

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Json& j, const Where& where) {
  const std::string type = get_type(j, where);
  if (type == "ByteLevel") {
    check_keys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<ByteLevelPre>(get_bool(j, "add_prefix_space", where, true),
                                          get_bool(j, "use_regex", where, true), where);
  }
  if (type == "Split") {
    check_keys(j, where, {"type", "pattern", "behavior", "invert"});
    const auto it = j.find("pattern");
    const Where at = where.key("pattern");
    if (it == j.end() || !it->is_object() || it->size() != 1) {
      at.fail("must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    }
    std::string pattern;
    if (const auto regex = get_string(*it, "Regex", at)) {
      pattern = *regex;
    } else if (const auto literal = get_string(*it, "String", at)) {
      pattern = escape_literal(*literal);
    } else {
      at.fail("must be {\"Regex\": \"...\"} or {\"String\": \"...\"}, found " + short_dump(*it));
    }
    return std::make_unique<SplitPre>(Regex(pattern, at.str()), parse_behavior(j, where),
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

// ---- decoders -----------------------------------------------------------------

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(Pieces* tokens) const = 0;
};

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(Pieces* tokens) const override {
    const ByteTable& table = byte_table();
    std::string bytes;
    for (const std::string& token : *tokens) {
      // A token with any character outside the table keeps its own bytes.
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < token.size();) {
        size_t len = 0;
        const uint32_t cp = decode_at(token, i, &len);
        const auto it = table.char_to_byte.find(cp);
        if (it == table.char_to_byte.end()) {
          all = false;
          break;
        }
        mapped += static_cast<char>(it->second);
        i += len;
      }
      bytes += all ? mapped : token;
    }
    *tokens = {to_valid_utf8(bytes)};
  }
};

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(Pieces* tokens) const override {
    Pieces out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (to_valid_utf8(pending) == pending) {
        out.push_back(pending);
      } else {
        // As the Rust package: one U+FFFD per byte of an invalid run.
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& token : *tokens) {
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' &&
          std::isxdigit(static_cast<unsigned char>(token[3])) &&
          std::isxdigit(static_cast<unsigned char>(token[4]))) {
        pending += static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(Pieces* tokens) const override {
    std::string all;
    for (const std::string& token : *tokens) all += token;
    *tokens = {all};
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(Pieces* tokens) const override {
    for (std::string& token : *tokens) {
      std::vector<std::pair<size_t, uint32_t>> chars;  // byte offset, code point
      for (size_t i = 0; i < token.size();) {
        size_t len = 0;
        chars.emplace_back(i, decode_at(token, i, &len));
        i += len;
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start_, chars.size()) && chars[i].second == content_; ++i) {
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < std::min(stop_, chars.size()); ++i) {
        const size_t index = chars.size() - i - 1;
        if (chars[index].second != content_) break;
        stop_cut = index;
      }
      if (stop_cut <= start_cut) {
        token.clear();
        continue;
      }
      const size_t from = chars[start_cut].first;
      const size_t to = stop_cut < chars.size() ? chars[stop_cut].first : token.size();
      token = token.substr(from, to - from);
    }
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(Pieces* tokens) const override {
    for (std::string& token : *tokens) {
      std::string out;
      size_t pos = 0;
      for (;;) {
        const size_t hit = token.find(pattern_, pos);
        if (hit == std::string::npos) break;
        out.append(token, pos, hit - pos);
        out += content_;
        pos = hit + pattern_.size();
      }
      out.append(token, pos, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  std::string pattern_;
  std::string content_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(Pieces* tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

std::unique_ptr<Decoder> parse_decoder(const Json& j, const Where& where) {
  const std::string type = get_type(j, where);
  if (type == "ByteLevel") {
    // Its options concern offsets and encoding, not decoding.
    check_keys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<ByteLevelDecoder>();
  }
  if (type == "ByteFallback") {
    check_keys(j, where, {"type"});
    return std::make_unique<ByteFallbackDecoder>();
  }
  if (type == "Fuse") {
    check_keys(j, where, {"type"});
    return std::make_unique<FuseDecoder>();
  }
  if (type == "Strip") {
    check_keys(j, where, {"type", "content", "start", "stop"});
    const auto content = get_string(j, "content", where);
    size_t len = 0;
    if (!content || content->empty() || decode_at(*content, 0, &len) == 0 ||
        len != content->size()) {
      where.key("content").fail("must be one character");
    }
    auto count = [&](const char* key) -> size_t {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_number_unsigned())
        where.key(key).fail("must be a count (0 or more)");
      return it->get<size_t>();
    };
    return std::make_unique<StripDecoder>(decode_at(*content, 0, &len), count("start"),
                                          count("stop"));
  }
  if (type == "Replace") {
    check_keys(j, where, {"type", "pattern", "content"});
    const Where at = where.key("pattern");
    const auto it = j.find("pattern");
    if (it == j.end() || !it->is_object()) at.fail("must be {\"String\": \"...\"}");
    const auto literal = get_string(*it, "String", at);
    if (!literal || it->size() != 1) {
      at.fail("= " + short_dump(*it) + " is not supported; supported: {\"String\": \"...\"}");
    }
    const auto content = get_string(j, "content", where);
    if (!content) where.key("content").fail("is missing");
    if (literal->empty()) at.fail("must not be empty");
    return std::make_unique<ReplaceDecoder>(*literal, *content);
  }
  if (type == "Sequence") {
    check_keys(j, where, {"type", "decoders"});
    const auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) where.key("decoders").fail("must be a list");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      steps.push_back(parse_decoder((*it)[i], where.key("decoders").index(i)));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  unsupported_type(where, type,
                   {"ByteLevel", "ByteFallback", "Fuse", "Strip", "Replace", "Sequence"});
}

// ---- post-processors ------------------------------------------------------------

// What a post-processor does to one sequence's ids: ids before and after.
struct Template {
  std::vector<TokenId> before;
  std::vector<TokenId> after;
};

void parse_post_processor(const Json& j, const Where& where, Template* out) {
  const std::string type = get_type(j, where);
  if (type == "ByteLevel") {
    // Offsets only; the ids are unchanged.
    check_keys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    return;
  }
  if (type == "Sequence") {
    check_keys(j, where, {"type", "processors"});
    const auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) where.key("processors").fail("must be a list");
    for (size_t i = 0; i < it->size(); ++i) {
      parse_post_processor((*it)[i], where.key("processors").index(i), out);
    }
    return;
  }
  if (type == "TemplateProcessing") {
    // "pair" is read for its shape only: kolos encodes single sequences.
    check_keys(j, where, {"type", "single", "pair", "special_tokens"});
    const auto specials = j.find("special_tokens");
    const Where sw = where.key("special_tokens");
    if (specials == j.end() || !specials->is_object()) sw.fail("must be an object");
    const auto single = j.find("single");
    const Where at = where.key("single");
    if (single == j.end() || !single->is_array()) at.fail("must be a list");
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const Json& piece = (*single)[i];
      const Where pw = at.index(i);
      if (!piece.is_object() || piece.size() != 1)
        pw.fail("must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      if (piece.contains("Sequence")) {
        if (seen_sequence) pw.fail("repeats the sequence; a single template holds it once");
        seen_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken")) {
        pw.fail("= " + short_dump(piece) + " is not supported; supported: SpecialToken, Sequence");
      }
      const auto name = get_string(piece["SpecialToken"], "id", pw.key("SpecialToken"));
      if (!name) pw.key("SpecialToken.id").fail("is missing");
      const auto special = specials->find(*name);
      if (special == specials->end()) {
        pw.key("SpecialToken.id").fail("= \"" + *name + "\" is not in " + sw.path());
      }
      const auto ids = special->find("ids");
      if (ids == special->end() || !ids->is_array())
        sw.key(*name).key("ids").fail("must be a list of ids");
      for (const Json& id : *ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0)
          sw.key(*name).key("ids").fail("must hold ids (0 or more)");
        (seen_sequence ? out->after : out->before)
            .push_back(static_cast<TokenId>(id.get<int64_t>()));
      }
    }
    if (!seen_sequence) at.fail("has no {\"Sequence\": ...}: the text would be dropped");
    return;
  }
  unsupported_type(where, type, {"ByteLevel", "TemplateProcessing", "Sequence"});
}

// ---- added tokens -------------------------------------------------------------

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

// AddedVocabulary::find_matches for one piece of text.
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

// ---- the tokenizer --------------------------------------------------------------

std::string read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw DataError("tokenizer " + path + " is a directory; expected a tokenizer.json file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open tokenizer " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw DataError("cannot read tokenizer " + path);
  return text.str();
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

class HfTokenizer : public Tokenizer {
 public:
  explicit HfTokenizer(const std::string& path) : path_(path) {
    Json j;
    try {
      j = Json::parse(read_file(path));
    } catch (const Json::parse_error& e) {
      throw DataError("tokenizer " + path + " is not valid JSON: " + e.what());
    }
    const Where top(path, "");
    check_keys(j, top,
               {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                "model", "post_processor", "decoder"});
    for (const char* key : {"truncation", "padding"}) {
      if (j.contains(key) && !j[key].is_null()) {
        top.key(key).fail("= " + short_dump(j[key]) +
                          " is not supported; supported: null (kolos encodes whole texts)");
      }
    }
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      normalizer_ = parse_normalizer(j["normalizer"], top.key("normalizer"));
    }
    parse_model(j, top);
    parse_added_tokens(j, top);
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
      pre_tokenizer_ = parse_pre_tokenizer(j["pre_tokenizer"], top.key("pre_tokenizer"));
    }
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      parse_post_processor(j["post_processor"], top.key("post_processor"), &template_);
    }
    for (const TokenId id : template_.before) check_id(id, top.key("post_processor"));
    for (const TokenId id : template_.after) check_id(id, top.key("post_processor"));
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      decoder_ = parse_decoder(j["decoder"], top.key("decoder"));
    }
    find_special_ids();
  }

  std::vector<TokenId> encode(std::string_view raw, bool add_special_tokens) const override {
    const std::string text = to_valid_utf8(raw);
    std::vector<Segment> first, segments;
    split_on_added(text, raw_matcher_, &first);
    for (Segment& s : first) {
      if (s.id) {
        segments.push_back(std::move(s));
      } else {
        split_on_added(normalizer_ ? normalizer_->apply(s.text) : s.text, normalized_matcher_,
                       &segments);
      }
    }
    std::vector<TokenId> ids;
    if (add_special_tokens) ids = template_.before;
    std::unordered_map<std::string, std::vector<TokenId>> cache;
    Pieces pieces;
    for (Segment& s : segments) {
      if (s.id) {
        ids.push_back(*s.id);
        continue;
      }
      pieces.clear();
      pieces.push_back(std::move(s.text));
      if (pre_tokenizer_) pre_tokenizer_->apply(&pieces);
      for (const std::string& piece : pieces) {
        auto it = cache.find(piece);
        if (it == cache.end()) {
          std::vector<TokenId> word;
          model_->tokenize(piece, &word);
          it = cache.emplace(piece, std::move(word)).first;
        }
        ids.insert(ids.end(), it->second.begin(), it->second.end());
      }
    }
    if (add_special_tokens) ids.insert(ids.end(), template_.after.begin(), template_.after.end());
    return ids;
  }

  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const override {
    Pieces tokens;
    tokens.reserve(ids.size());
    for (const TokenId id : ids) {
      if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
        if (skip_special_tokens && it->second->special) continue;
        tokens.push_back(it->second->content);
        continue;
      }
      const std::string* token = model_->id_to_token(id);
      if (token == nullptr) {
        throw Error("tokenizer " + path_ + ": cannot decode id " + std::to_string(id) +
                    ": not in the vocabulary (ids 0.." + std::to_string(vocab_size() - 1) + ")");
      }
      if (skip_special_tokens && special_contents_.count(*token) != 0) continue;
      tokens.push_back(*token);
    }
    if (!decoder_) {
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return to_valid_utf8(out);
    }
    decoder_->decode_chain(&tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return to_valid_utf8(out);
  }

  int64_t vocab_size() const override {
    int64_t bound = model_->id_bound();
    for (const AddedToken& t : added_) bound = std::max<int64_t>(bound, t.id + 1);
    return bound;
  }

  std::optional<TokenId> token_to_id(std::string_view token) const override {
    for (const AddedToken& t : added_) {
      if (t.content == token) return t.id;
    }
    return model_->token_to_id(token);
  }

  std::optional<std::string> id_to_token(TokenId id) const override {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return it->second->content;
    if (const std::string* token = model_->id_to_token(id)) return *token;
    return std::nullopt;
  }

  std::optional<TokenId> bos_id() const override { return bos_; }
  std::optional<TokenId> eos_id() const override { return eos_; }
  std::string description() const override { return "tokenizer.json (BPE)"; }
  const std::string& path() const override { return path_; }

 private:
  void check_id(TokenId id, const Where& where) const {
    if (id < 0 || (!model_->id_to_token(id) && added_by_id_.count(id) == 0)) {
      where.fail("names id " + std::to_string(id) + ", which is not in the vocabulary");
    }
  }

  void parse_model(const Json& j, const Where& top) {
    const Where where = top.key("model");
    const auto it = j.find("model");
    if (it == j.end() || it->is_null()) where.fail("is missing");
    const Json& m = *it;
    const std::string type = get_type(m, where);
    if (type != "BPE") unsupported_type(where, type, {"BPE"});
    check_keys(m, where,
               {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
    if (m.contains("dropout") && !m["dropout"].is_null()) {
      if (!m["dropout"].is_number()) where.key("dropout").fail("must be a number or null");
      if (m["dropout"].get<double>() != 0.0) {
        where.key("dropout").fail("= " + short_dump(m["dropout"]) +
                                  " is not supported; supported: null or 0 (deterministic "
                                  "encoding)");
      }
    }
    BpeOptions options;
    options.unk_token = get_string(m, "unk_token", where);
    options.continuing_subword_prefix =
        get_string(m, "continuing_subword_prefix", where).value_or("");
    options.end_of_word_suffix = get_string(m, "end_of_word_suffix", where).value_or("");
    options.fuse_unk = get_bool(m, "fuse_unk", where, false);
    options.byte_fallback = get_bool(m, "byte_fallback", where, false);
    options.ignore_merges = get_bool(m, "ignore_merges", where, false);

    const auto vocab = m.find("vocab");
    if (vocab == m.end() || !vocab->is_object())
      where.key("vocab").fail("must be an object of token: id");
    std::vector<std::pair<std::string, TokenId>> entries;
    entries.reserve(vocab->size());
    for (const auto& item : vocab->items()) {
      if (!item.value().is_number_integer() || item.value().get<int64_t>() < 0 ||
          item.value().get<int64_t>() > INT32_MAX) {
        where.key("vocab").fail("[\"" + item.key() + "\"] = " + short_dump(item.value()) +
                                " is not an id (an integer 0..2^31-1)");
      }
      entries.emplace_back(item.key(), static_cast<TokenId>(item.value().get<int64_t>()));
    }
    const auto merges = m.find("merges");
    const Where mw = where.key("merges");
    std::vector<std::pair<std::string, std::string>> pairs;
    if (merges != m.end() && !merges->is_null()) {
      if (!merges->is_array()) mw.fail("must be a list");
      pairs.reserve(merges->size());
      for (size_t i = 0; i < merges->size(); ++i) {
        const Json& e = (*merges)[i];
        if (e.is_string()) {
          // The older spelling "a b": one space separates the two tokens.
          const std::string s = e.get<std::string>();
          const size_t space = s.find(' ');
          if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
            mw.index(i).fail("= " + short_dump(e) + " must be two tokens separated by one space");
          }
          pairs.emplace_back(s.substr(0, space), s.substr(space + 1));
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
          pairs.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
        } else {
          mw.index(i).fail("= " + short_dump(e) + " must be [\"a\", \"b\"] or \"a b\"");
        }
      }
    }
    model_ = std::make_unique<BpeModel>(std::move(entries), pairs, std::move(options),
                                        path_ + ": model");
  }

  void parse_added_tokens(const Json& j, const Where& top) {
    const auto it = j.find("added_tokens");
    if (it == j.end() || it->is_null()) return;
    const Where where = top.key("added_tokens");
    if (!it->is_array()) where.fail("must be a list");
    added_.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& e = (*it)[i];
      const Where at = where.index(i);
      check_keys(e, at,
                 {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
      AddedToken token;
      if (!e.contains("id") || !e["id"].is_number_integer() || e["id"].get<int64_t>() < 0 ||
          e["id"].get<int64_t>() > INT32_MAX) {
        at.key("id").fail("must be an id (an integer 0..2^31-1)");
      }
      token.id = static_cast<TokenId>(e["id"].get<int64_t>());
      const auto content = get_string(e, "content", at);
      if (!content || content->empty()) at.key("content").fail("must be a non-empty string");
      token.content = *content;
      token.single_word = get_bool(e, "single_word", at, false);
      token.lstrip = get_bool(e, "lstrip", at, false);
      token.rstrip = get_bool(e, "rstrip", at, false);
      token.normalized = get_bool(e, "normalized", at, true);
      token.special = get_bool(e, "special", at, false);
      // A normalized token is matched in its normalized form.
      token.pattern =
          token.normalized && normalizer_ ? normalizer_->apply(token.content) : token.content;
      added_.push_back(std::move(token));
    }
    for (const AddedToken& token : added_) {
      added_by_id_[token.id] = &token;
      (token.normalized ? normalized_matcher_ : raw_matcher_).add(&token);
      if (token.special) special_contents_.insert(token.content);
    }
  }

  // bos and eos: tokenizer_config.json next to the file, else well-known
  // token names (docs/tokenizers.md).
  void find_special_ids() {
    const std::string config_path = parent_directory(path_) + "/tokenizer_config.json";
    std::ifstream in(config_path);
    if (in) {
      Json config;
      try {
        config = Json::parse(in);
      } catch (const Json::parse_error& e) {
        throw DataError("tokenizer config " + config_path + " is not valid JSON: " + e.what());
      }
      auto named = [&](const char* key) -> std::optional<TokenId> {
        const auto it = config.find(key);
        if (it == config.end() || it->is_null()) return std::nullopt;
        std::string content;
        if (it->is_string()) {
          content = it->get<std::string>();
        } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
          content = (*it)["content"].get<std::string>();
        } else {
          throw DataError(config_path + ": " + key +
                          " must be a token string or {\"content\": ...}");
        }
        const auto id = token_to_id(content);
        if (!id) {
          throw DataError(config_path + ": " + key + " = \"" + content + "\" is not a token of " +
                          path_);
        }
        return id;
      };
      bos_ = named("bos_token");
      eos_ = named("eos_token");
    }
    auto first_of = [&](std::initializer_list<const char*> names) -> std::optional<TokenId> {
      for (const char* name : names) {
        if (const auto id = token_to_id(name)) return id;
      }
      return std::nullopt;
    };
    if (!bos_) bos_ = first_of({"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"});
    if (!eos_) eos_ = first_of({"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"});
  }

  std::string path_;
  std::unique_ptr<BpeModel> model_;
  std::vector<AddedToken> added_;  // never resized after parse_added_tokens
  std::unordered_map<TokenId, const AddedToken*> added_by_id_;
  std::set<std::string> special_contents_;
  AddedMatcher raw_matcher_;                // normalized = false
  AddedMatcher normalized_matcher_;         // normalized = true
  std::unique_ptr<Normalizer> normalizer_;  // nullptr: the identity
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  Template template_;
  std::optional<TokenId> bos_, eos_;
};

}  // namespace
}  // namespace hf

std::unique_ptr<Tokenizer> open_hf_tokenizer_json(const std::string& path) {
  return std::make_unique<hf::HfTokenizer>(path);
}

}  // namespace kolos::tokenizer
