// Normalizers (normalizer.h): the Unicode forms through ICU, Prepend, Replace.
#include "normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include <optional>
#include <vector>

#include "regex.h"

namespace kolos::tokenizer::hf {
namespace {

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

// Prepend: `prepend` in front of every non-empty piece (LLaMA-2's "▁").
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  std::string apply(const std::string& text) const override {
    return text.empty() ? text : prepend_ + text;
  }

 private:
  std::string prepend_;
};

// Replace: every match of the pattern by `content`.
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Regex regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  std::string apply(const std::string& text) const override {
    std::vector<std::pair<size_t, size_t>> found;
    regex_.find_all(text, &found);
    if (found.empty()) return text;
    std::string out;
    size_t last = 0;
    for (const auto& [s, e] : found) {
      out.append(text, last, s - last);
      out += content_;
      last = e;
    }
    out.append(text, last, std::string::npos);
    return out;
  }

 private:
  Regex regex_;
  std::string content_;
};

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const Json& j, const Where& where) {
  const std::string type = get_type(j, where);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    check_keys(j, where, {"type"});
    return std::make_unique<UnicodeNormalizer>(type, where.key("type"));
  }
  if (type == "Prepend") {
    check_keys(j, where, {"type", "prepend"});
    const auto prepend = get_string(j, "prepend", where);
    if (!prepend) where.key("prepend").fail("is missing");
    return std::make_unique<PrependNormalizer>(*prepend);
  }
  if (type == "Replace") {
    check_keys(j, where, {"type", "pattern", "content"});
    const Where at = where.key("pattern");
    const std::string pattern = read_pattern(j, where);
    if (pattern.empty()) at.fail("must not be empty");
    const auto content = get_string(j, "content", where);
    if (!content) where.key("content").fail("is missing");
    return std::make_unique<ReplaceNormalizer>(Regex(pattern, at.str()), *content);
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
  unsupported_type(where, type, {"NFC", "NFD", "NFKC", "NFKD", "Prepend", "Replace", "Sequence"});
}

}  // namespace kolos::tokenizer::hf
