// Post-processors (post_processor.h).
#include "post_processor.h"

namespace kolos::tokenizer::hf {

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

}  // namespace kolos::tokenizer::hf
