// tokenizer.json "decoder": token strings back to text (ByteLevel,
// ByteFallback, Fuse, Strip, Replace, Sequence), as the Rust package's
// Decoder::decode_chain.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "json_reader.h"

namespace kolos::tokenizer::hf {

using Pieces = std::vector<std::string>;

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(Pieces* tokens) const = 0;
};

// The decoder `j` describes; refuses the types kolos lacks.
std::unique_ptr<Decoder> parse_decoder(const Json& j, const Where& where);

}  // namespace kolos::tokenizer::hf
