// Decoders (decoder.h).
#include "decoder.h"

#include <algorithm>
#include <cctype>

#include "kolos/tokenizer/tokenizer.h"
#include "unicode.h"

namespace kolos::tokenizer::hf {
namespace {

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

}  // namespace

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

}  // namespace kolos::tokenizer::hf
