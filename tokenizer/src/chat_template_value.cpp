// The helpers on chat-template values and strings (chat_template_detail.h):
// type names, lookup in a mapping, truthiness, UTF-8 characters, ASCII
// whitespace stripping, and tojson.
#include "chat_template_detail.h"

#include <algorithm>
#include <cstdio>

#include "kolos/core/format.h"

namespace kolos::tokenizer::jinja {

const char* type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined:
      return "undefined";
    case Value::Type::kNone:
      return "none";
    case Value::Type::kBool:
      return "boolean";
    case Value::Type::kInt:
      return "integer";
    case Value::Type::kString:
      return "string";
    case Value::Type::kList:
      return "list";
    case Value::Type::kMap:
      return "mapping";
  }
  return "?";
}

Value find_key(const Map& map, const std::string& key) {
  for (const auto& [k, v] : map) {
    if (k == key) return v;
  }
  return Value{};
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return false;
    case Value::Type::kBool:
      return v.b;
    case Value::Type::kInt:
      return v.i != 0;
    case Value::Type::kString:
      return !v.s.empty();
    case Value::Type::kList:
      return !v.list->empty();
    case Value::Type::kMap:
      return !v.map->empty();
  }
  return false;
}

// The UTF-8 characters of `s` (Python's str indexes and counts these).
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0xF0) {
      n = 4;
    } else if (c >= 0xE0) {
      n = 3;
    } else if (c >= 0xC0) {
      n = 2;
    }
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string strip(const std::string& s, bool left, bool right) {
  size_t a = 0, b = s.size();
  while (left && a < b && is_space(s[a])) ++a;
  while (right && b > a && is_space(s[b - 1])) --b;
  return s.substr(a, b - a);
}

// Python's json.dumps(x, ensure_ascii=False), which transformers' tojson is.
void to_json(const Value& v, std::string& out) {
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      out += "null";
      return;
    case Value::Type::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::Type::kInt:
      out += std::to_string(v.i);
      return;
    case Value::Type::kString:
      out += ::kolos::detail::quote_escaped(v.s, false);
      return;
    case Value::Type::kList: {
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        to_json((*v.list)[k], out);
      }
      out += ']';
      return;
    }
    case Value::Type::kMap: {
      out += '{';
      bool first = true;
      for (const auto& [key, x] : *v.map) {
        if (!first) out += ", ";
        first = false;
        to_json(Value::string(key), out);
        out += ": ";
        to_json(x, out);
      }
      out += '}';
      return;
    }
  }
}

}  // namespace kolos::tokenizer::jinja
