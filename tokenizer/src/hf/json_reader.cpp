// tokenizer.json reading helpers (json_reader.h).
#include "json_reader.h"

#include <algorithm>

namespace kolos::tokenizer::hf {

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

}  // namespace kolos::tokenizer::hf
