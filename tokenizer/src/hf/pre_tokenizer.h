// tokenizer.json "pre_tokenizer": ByteLevel, Split, Digits and Sequence,
// each a step that splits pieces of text further (as the Rust package's
// PreTokenizedString::split).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "json_reader.h"

namespace kolos::tokenizer::hf {

using Pieces = std::vector<std::string>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokenization.
  virtual void apply(Pieces* pieces) const = 0;
};

// The pre-tokenizer `j` describes; refuses the types kolos lacks. Compiles
// its regexes (kolos::DataError naming the pattern's JSON path).
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Json& j, const Where& where);

}  // namespace kolos::tokenizer::hf
