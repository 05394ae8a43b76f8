// tokenizer.json "post_processor": what it adds around one sequence's ids
// (TemplateProcessing's single template; ByteLevel changes offsets only).
#pragma once

#include <vector>

#include "json_reader.h"
#include "kolos/tokenizer/tokenizer.h"

namespace kolos::tokenizer::hf {

// What a post-processor does to one sequence's ids: ids before and after.
struct Template {
  std::vector<TokenId> before;
  std::vector<TokenId> after;
};

// Adds to `out` what the post-processor `j` puts before and after the ids;
// refuses the types kolos lacks.
void parse_post_processor(const Json& j, const Where& where, Template* out);

}  // namespace kolos::tokenizer::hf
