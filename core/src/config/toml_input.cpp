// A run's TOML text into a document: the checks toml11 leaves to its
// caller (UTF-8, nesting depth, integers that do not fit 64 bits), its
// parse, and `--set` overrides written into the parsed document, each value
// parsed as TOML itself, so overrides meet the same checks as the file.
#include "toml_input.h"

#include <cctype>
#include <cstdint>
#include <sstream>

#include "kolos/core/error.h"
#include "kolos/core/settings.h"

namespace kolos {
namespace {

// TOML text is UTF-8. toml11 checks that itself, but its error path for an
// invalid byte in a literal string mixes iterators of two buffers and reads
// out of bounds (found by fuzzing), so invalid bytes are refused first.
void check_utf8(const std::string& text, const std::string& name) {
  size_t line = 1, line_start = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c == '\n') {
        ++line;
        line_start = i + 1;
      }
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t code = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      code = c & 0x07;
    }
    bool valid = len > 0 && i + len <= n;
    for (size_t k = 1; valid && k < len; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0) == 0x80;
      code = (code << 6) | (next & 0x3F);
    }
    const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};  // no overlong forms
    valid = valid && code >= smallest[len] && code <= 0x10FFFF && (code < 0xD800 || code > 0xDFFF);
    if (!valid) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", c);
      throw ConfigError(name + ":" + std::to_string(line) + ":" +
                        std::to_string(i - line_start + 1) + ": a byte (" + byte +
                        ") that is not UTF-8; TOML files must be UTF-8 text");
    }
    i += len;
  }
}

// toml11 parses arrays and inline tables by recursion, so a value nested
// deeply enough (200,000 levels of `[`) overflows the stack. Nesting is
// counted before parsing, outside strings and comments; past kMaxNesting the
// text is refused with where the limit was crossed. Binary integers longer
// than toml11 can compute are refused the same way.
constexpr int kMaxNesting = 64;
constexpr size_t kMaxBinaryDigits = 62;

void check_nesting(const std::string& text, const std::string& name) {
  int depth = 0, line = 1;
  size_t line_start = 0;
  const size_t n = text.size();
  // Skips a string that starts at i (after its opening quote(s)); returns the
  // index after its closing quote(s), counting the lines it spans.
  const auto skip_string = [&](size_t i, const std::string& close, bool escapes, bool multiline) {
    while (i < n) {
      if (escapes && text[i] == '\\') {
        if (i + 1 < n && text[i + 1] == '\n') {  // a line-ending backslash
          ++line;
          line_start = i + 2;
        }
        i += 2;
        continue;
      }
      if (text.compare(i, close.size(), close) == 0) return i + close.size();
      if (text[i] == '\n') {
        if (!multiline) return i;  // unterminated: the parser reports it
        ++line;
        line_start = i + 1;
      }
      ++i;
    }
    return n;
  };
  for (size_t i = 0; i < n;) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      line_start = ++i;
    } else if (c == '#') {
      while (i < n && text[i] != '\n') ++i;
    } else if (text.compare(i, 3, "\"\"\"") == 0) {
      i = skip_string(i + 3, "\"\"\"", true, true);
    } else if (text.compare(i, 3, "'''") == 0) {
      i = skip_string(i + 3, "'''", false, true);
    } else if (c == '"') {
      i = skip_string(i + 1, "\"", true, false);
    } else if (c == '\'') {
      i = skip_string(i + 1, "'", false, false);
    } else if (c == '0' && i + 1 < n && text[i + 1] == 'b' &&
               (i == 0 || !(std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                            text[i - 1] == '_'))) {
      // toml11 computes a binary integer's place values in int64 and
      // overflows (undefined behaviour) from its 63rd digit on.
      size_t j = i + 2, digits = 0;
      for (; j < n && (text[j] == '0' || text[j] == '1' || text[j] == '_'); ++j) {
        if (text[j] != '_') ++digits;
      }
      if (digits > kMaxBinaryDigits) {
        throw ConfigError(name + ":" + std::to_string(line) + ":" +
                          std::to_string(i - line_start + 1) + ": a binary integer of " +
                          std::to_string(digits) + " digits; kolos reads at most " +
                          std::to_string(kMaxBinaryDigits) +
                          " (write larger values in decimal or hexadecimal)");
      }
      i = j;
    } else {
      if (c == '[' || c == '{') {
        if (++depth > kMaxNesting) {
          throw ConfigError(name + ":" + std::to_string(line) + ":" +
                            std::to_string(i - line_start + 1) +
                            ": arrays or inline tables nested more than " +
                            std::to_string(kMaxNesting) + " deep; kolos reads at most " +
                            std::to_string(kMaxNesting) + " levels");
        }
      } else if ((c == ']' || c == '}') && depth > 0) {
        --depth;
      }
      ++i;
    }
  }
}

// toml11 reads a decimal, octal or hexadecimal integer too large for 64 bits
// as the largest int64 and wraps a binary one, without a word: each integer
// literal is read again from its source text and refused unless it fits.
bool fits_int64(const std::string& token) {
  size_t i = 0;
  bool negative = false;
  if (i < token.size() && (token[i] == '+' || token[i] == '-')) negative = token[i++] == '-';
  uint64_t base = 10;
  if (token.size() > i + 1 && token[i] == '0' && std::isalpha(static_cast<unsigned char>(token[i + 1]))) {
    base = token[i + 1] == 'x' ? 16 : token[i + 1] == 'o' ? 8 : 2;
    i += 2;
  }
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  uint64_t value = 0;
  for (; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c == '_') continue;
    const uint64_t digit = std::isdigit(c) ? c - '0' : std::tolower(c) - 'a' + 10;
    if (value > (limit - digit) / base) return false;
    value = value * base + digit;
  }
  return true;
}

// Throws for the first integer of `v` (a parsed document or value) whose
// literal does not fit 64 bits. `where` names an override's origin; empty
// for the file `name`.
void check_integers(const toml::value& v, const std::string& name, const std::string& where) {
  if (v.is_table()) {
    for (const auto& kv : v.as_table()) check_integers(kv.second, name, where);
  } else if (v.is_array()) {
    for (const auto& item : v.as_array()) check_integers(item, name, where);
  } else if (v.is_integer()) {
    const toml::source_location loc = v.location();
    const std::string& line = loc.line_str();
    if (loc.column() == 0 || loc.column() > line.size()) return;
    const std::string token = line.substr(loc.column() - 1, loc.region());
    if (fits_int64(token)) return;
    const std::string message = "the integer " + (token.size() > 40 ? token.substr(0, 37) + "..." : token) +
                                " does not fit 64 bits; integers must be in [-9223372036854775808, "
                                "9223372036854775807].";
    if (!where.empty()) throw ConfigError(where + ": " + message);
    fail(file_origin(loc, name), message);
  }
}

// Parses the value half of an override as TOML, or takes it as a string.
toml::value parse_override_value(const std::string& text, const std::string& origin,
                                 const std::string& where) {
  const std::string short_origin = origin.size() > 80 ? origin.substr(0, 77) + "..." : origin;
  check_utf8(text, short_origin);
  check_nesting(text, short_origin);
  try {
    std::istringstream in("v = " + text);
    toml::value doc = toml::parse(in, origin);
    if (doc.is_table() && doc.as_table().size() == 1 && doc.contains("v")) {
      check_integers(doc.at("v"), origin, where);
      return doc.at("v");
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception&) {
    // Not TOML (e.g. `model.name=gpt`): a bare word stands for a string.
  }
  return toml::value(text);
}

// Writes `o` into `doc`, creating tables on the way. A shorthand integer on
// the path (`tensor = 4`) becomes its table form so `parallel.tensor.mode=2d`
// can refine it.
void apply_override(toml::value& doc, const Override& o, const std::string& value_text,
                    const std::string& file) {
  std::vector<std::string> parts = split_key(o.key);
  if (parts.empty()) parts.emplace_back();  // "=value": reported below as an empty key
  const std::string where = file + ": --set " + o.text;
  for (const auto& part : parts) {
    if (part.empty()) {
      throw ConfigError(where + ": `" + o.key +
                        "` is not a valid key; write section.key=value (e.g. "
                        "parallel.tensor.size=2).");
    }
  }
  toml::value* v = &doc;
  std::string path;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path += (i ? "." : "") + parts[i];
    toml::value& child = (*v)[parts[i]];
    if (child.is_uninitialized()) {
      child = toml::table{};
    } else if (child.is_integer() && i == 1 && parts[0] == "parallel") {
      toml::value expanded = toml::table{};
      expanded[parts[1] == "zero" ? "stage" : "size"] = child;
      child = expanded;
    } else if (!child.is_table()) {
      throw ConfigError(where + ": `" + path + "` is " + type_phrase(child.type()) + " (" +
                        show_value(child) + "), not a table, so `" + o.key + "` cannot be set.");
    }
    v = &child;
  }
  (*v)[parts.back()] = parse_override_value(value_text, "--set " + o.text, where);
}

}  // namespace

toml::value parse_document(const std::string& text, const std::string& name) {
  check_utf8(text, name);
  check_nesting(text, name);
  std::istringstream in(text);
  toml::value doc;
  try {
    doc = toml::parse(in, name);
  } catch (const toml::exception& e) {
    const auto& loc = e.location();
    std::string where = name;
    // Only the line: toml11's column here is that of its region, not of the
    // caret its own message draws below.
    if (loc.file_name() == name) where += ":" + std::to_string(loc.line());
    throw ConfigError(where + ": malformed TOML\n" + e.what());
  } catch (const std::exception& e) {
    throw ConfigError(name + ": malformed TOML\n" + e.what());
  }
  check_integers(doc, name, "");
  return doc;
}

std::vector<Override> apply_overrides(toml::value& doc, const std::vector<std::string>& overrides,
                                      const std::string& name) {
  std::vector<Override> parsed;
  for (const auto& text : overrides) {
    const auto eq = text.find('=');
    if (eq == std::string::npos) {
      throw ConfigError(name + ": --set " + text +
                        ": expected section.key=value (e.g. parallel.tensor.size=2 or "
                        "model.name=gpt), found no '='.");
    }
    Override o{text, text.substr(0, eq)};
    // Tolerate "key = value" as typed in a TOML file.
    while (!o.key.empty() && o.key.back() == ' ') o.key.pop_back();
    while (!o.key.empty() && o.key.front() == ' ') o.key.erase(0, 1);
    std::string value = text.substr(eq + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    apply_override(doc, o, value, name);
    parsed.push_back(std::move(o));
  }
  return parsed;
}

}  // namespace kolos
