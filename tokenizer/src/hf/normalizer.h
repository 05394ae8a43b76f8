// tokenizer.json "normalizer": the Unicode normalization forms (ICU),
// Prepend and Replace (LLaMA-2's "▁" for spaces), Sequence.
#pragma once

#include <memory>
#include <string>

#include "json_reader.h"

namespace kolos::tokenizer::hf {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(const std::string& text) const = 0;
};

// The normalizer `j` describes (NFC, NFD, NFKC, NFKD, Prepend, Replace, a
// Sequence of them);
// nullptr for the identity (an empty Sequence). Refuses the other types.
std::unique_ptr<Normalizer> parse_normalizer(const Json& j, const Where& where);

}  // namespace kolos::tokenizer::hf
