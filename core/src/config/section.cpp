// The generic reader: a run's document, origins of its values, typed reads
// of a section, unknown-key reports. Every section of a run, the core's and
// the plugins', is read through this file.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <sstream>

#include "document.h"
#include "kolos/core/config_located.h"
#include "kolos/core/error.h"
#include "kolos/core/format.h"
#include "kolos/core/settings.h"

namespace kolos {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

std::string last_part(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string parent_key(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? std::string() : key.substr(0, dot);
}

}  // namespace

Origin file_origin(const toml::source_location& loc, const std::string& name,
                   const std::string& key_word) {
  size_t column = loc.column();
  size_t width = std::max<size_t>(1, loc.region());
  const std::string& line = loc.line_str();
  if (!key_word.empty()) {
    // toml11 records where values are, not keys: find the key on its line
    // (at the line start, or after '{' / ',' inside an inline table).
    size_t pos = 0;
    while ((pos = line.find(key_word, pos)) != std::string::npos) {
      size_t before = pos;
      while (before > 0 && (line[before - 1] == ' ' || line[before - 1] == '\t')) --before;
      size_t after = pos + key_word.size();
      while (after < line.size() && (line[after] == ' ' || line[after] == '\t')) ++after;
      const bool key_start = before == 0 || line[before - 1] == '{' || line[before - 1] == ',';
      if (key_start && after < line.size() && (line[after] == '=' || line[after] == '.')) {
        column = pos + 1;
        width = key_word.size();
        break;
      }
      pos += 1;
    }
  }
  Origin origin;
  origin.where = name + ":" + std::to_string(loc.line()) + ":" + std::to_string(column);
  const std::string number = std::to_string(loc.line());
  const std::string gutter(number.size() + 1, ' ');
  width = std::min(width, line.size() >= column ? line.size() - column + 1 : size_t{1});
  origin.snippet = "\n " + number + " | " + line + "\n" + gutter + " | " +
                   std::string(column > 0 ? column - 1 : 0, ' ') + "^" +
                   std::string(width > 1 ? width - 1 : 0, '~');
  return origin;
}

namespace {

// The document of a section built in code: no keys, origin the file name.
const ConfigDocument& empty_document() {
  static const ConfigDocument doc(toml::table{}, "<config>", {});
  return doc;
}

}  // namespace

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(key);
  while (std::getline(in, part, '.')) parts.push_back(part);
  if (!key.empty() && key.back() == '.') parts.emplace_back();
  return parts;
}

// ---- values as text ---------------------------------------------------------

std::string quote_toml(const std::string& s) { return detail::quote_escaped(s, true); }

std::string format_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string out = buf;
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& sep, bool quote) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += quote ? "\"" + items[i] + "\"" : items[i];
  }
  return out;
}

const char* type_phrase(toml::value_t type) {
  switch (type) {
    case toml::value_t::boolean:
      return "a boolean";
    case toml::value_t::integer:
      return "an integer";
    case toml::value_t::floating:
      return "a float";
    case toml::value_t::string:
      return "a string";
    case toml::value_t::offset_datetime:
    case toml::value_t::local_datetime:
      return "a date-time";
    case toml::value_t::local_date:
      return "a date";
    case toml::value_t::local_time:
      return "a time";
    case toml::value_t::array:
      return "an array";
    case toml::value_t::table:
      return "a table";
    default:
      return "nothing";
  }
}

std::string show_value(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::string:
      return quote_toml(v.as_string().str);
    case toml::value_t::integer:
      return std::to_string(v.as_integer());
    case toml::value_t::floating:
      return format_float(v.as_floating());
    case toml::value_t::boolean:
      return v.as_boolean() ? "true" : "false";
    default: {
      std::ostringstream out;
      out << v;
      std::string s = out.str();
      s.erase(std::remove(s.begin(), s.end(), '\n'), s.end());
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      return s;
    }
  }
}

void fail(const Origin& origin, const std::string& message) {
  throw ConfigError(origin.where + ": " + message + origin.snippet);
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  // Optimal-string-alignment distance (Levenshtein plus adjacent swaps),
  // case-insensitive. Allowed distance grows with the word: 1 up to 5
  // letters, 2 up to 8, then a third of the length. A tie between different
  // candidates is ambiguous and suggests nothing.
  const auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string a = lower(word);
  const size_t max_distance = std::max<size_t>(1, a.size() / 3);
  size_t best = std::numeric_limits<size_t>::max();
  std::string match;
  bool tie = false;
  for (const auto& candidate : candidates) {
    const std::string b = lower(candidate);
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    const size_t distance = d[a.size()][b.size()];
    // A one-letter word "matches" every one-letter candidate; require that
    // something of the word survives.
    if (distance > max_distance || distance >= std::max(a.size(), b.size())) continue;
    if (distance < best) {
      best = distance;
      match = candidate;
      tie = false;
    } else if (distance == best && lower(match) != b) {
      tie = true;
    }
  }
  return tie ? std::string() : match;
}

// ---- the document -----------------------------------------------------------

const toml::value* ConfigDocument::find(const std::string& key) const {
  const toml::value* v = &doc_;
  if (key.empty()) return v;
  for (const auto& part : split_key(key)) {
    if (!v->is_table()) return nullptr;
    const auto& table = v->as_table();
    const auto it = table.find(part);
    if (it == table.end()) return nullptr;
    v = &it->second;
  }
  return v;
}

const Override* ConfigDocument::override_for(const std::string& key) const {
  for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
    if (it->key == key || starts_with(key, it->key + ".") || starts_with(it->key, key + ".")) {
      return &*it;
    }
  }
  return nullptr;
}

Origin ConfigDocument::origin_of(const std::string& key, bool at_key) const {
  for (std::string k = key; !k.empty(); k = parent_key(k), at_key = false) {
    const toml::value* v = find(k);
    if (v == nullptr) continue;
    if (from_file(*v)) return file_origin(v->location(), name_, at_key ? last_part(k) : "");
    if (const Override* o = override_for(k)) return Origin{name_ + ": --set " + o->text, ""};
  }
  return Origin{name_, ""};
}

Origin ConfigDocument::origin_of_any(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (find(key) != nullptr) return origin_of(key);
  }
  return origin_of(keys.front());
}

std::vector<std::string> ConfigDocument::keys_in_order(const std::string& path) const {
  const toml::value* table = find(path);
  std::vector<std::pair<uint64_t, std::string>> ranked;
  if (table == nullptr || !table->is_table()) return {};
  for (const auto& kv : table->as_table()) {
    // By line, then column (keys of an inline table share a line).
    const auto& loc = kv.second.location();
    const uint64_t rank = from_file(kv.second)
                              ? (static_cast<uint64_t>(loc.line()) << 20) + loc.column()
                              : std::numeric_limits<uint64_t>::max();
    ranked.emplace_back(rank, kv.first);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (auto& r : ranked) out.push_back(std::move(r.second));
  return out;
}

// ---- sections ---------------------------------------------------------------

ConfigSection::ConfigSection(std::shared_ptr<const ConfigDocument> document, std::string path)
    : document_(std::move(document)), path_(std::move(path)) {}

namespace {
const ConfigDocument& doc_of(const std::shared_ptr<const ConfigDocument>& d) {
  return d ? *d : empty_document();
}
}  // namespace

std::string ConfigSection::source() const { return doc_of(document_).name(); }

bool ConfigSection::present() const {
  const toml::value* v = doc_of(document_).find(path_);
  return v != nullptr && v->is_table();
}

bool ConfigSection::has(const std::string& key) const {
  return present() && doc_of(document_).find(full(key)) != nullptr;
}

std::vector<std::string> ConfigSection::keys() const {
  return present() ? doc_of(document_).keys_in_order(path_) : std::vector<std::string>{};
}

ConfigSection ConfigSection::sub(const std::string& key) const {
  return ConfigSection(document_, full(key));
}

namespace {
const toml::value* value_at(const ConfigSection& s, const std::shared_ptr<const ConfigDocument>& d,
                            const std::string& full_key) {
  if (!s.present()) return nullptr;
  return doc_of(d).find(full_key);
}
}  // namespace

#define KOLOS_SECTION_VALUE(key)                                \
  const toml::value* v = value_at(*this, document_, full(key)); \
  if (v == nullptr) return false

bool ConfigSection::read(const std::string& key, int64_t& out) const {
  KOLOS_SECTION_VALUE(key);
  if (!v->is_integer()) {
    fail(key, std::string("expected an integer, found ") + type_phrase(v->type()) + " (" +
                  show_value(*v) + ")");
  }
  out = v->as_integer();
  return true;
}

bool ConfigSection::read(const std::string& key, double& out) const {
  KOLOS_SECTION_VALUE(key);
  if (v->is_integer()) {
    out = static_cast<double>(v->as_integer());
  } else if (v->is_floating()) {
    out = v->as_floating();
  } else {
    fail(key, std::string("expected a number, found ") + type_phrase(v->type()) + " (" +
                  show_value(*v) + ")");
  }
  return true;
}

bool ConfigSection::read(const std::string& key, bool& out) const {
  KOLOS_SECTION_VALUE(key);
  if (!v->is_boolean()) {
    fail(key, std::string("expected true or false, found ") + type_phrase(v->type()) + " (" +
                  show_value(*v) + ")");
  }
  out = v->as_boolean();
  return true;
}

bool ConfigSection::read(const std::string& key, std::string& out) const {
  KOLOS_SECTION_VALUE(key);
  if (!v->is_string()) {
    fail(key, std::string("expected a string, found ") + type_phrase(v->type()) + " (" +
                  show_value(*v) + ")");
  }
  out = v->as_string().str;
  return true;
}

bool ConfigSection::read(const std::string& key, std::vector<int64_t>& out) const {
  KOLOS_SECTION_VALUE(key);
  if (!v->is_array()) {
    fail(key, std::string("expected an array of integers, found ") + type_phrase(v->type()) + " (" +
                  show_value(*v) + ")");
  }
  std::vector<int64_t> values;
  for (const auto& item : v->as_array()) {
    if (!item.is_integer()) {
      fail(key, "expected an array of integers, found an element " + show_value(item));
    }
    values.push_back(item.as_integer());
  }
  out = std::move(values);
  return true;
}

bool ConfigSection::read(const std::string& key, std::vector<std::string>& out) const {
  KOLOS_SECTION_VALUE(key);
  if (!v->is_array()) {
    fail(key, std::string("expected an array of strings, found ") + type_phrase(v->type()) + " (" +
                  show_value(*v) + ")");
  }
  std::vector<std::string> values;
  for (const auto& item : v->as_array()) {
    if (!item.is_string()) {
      fail(key, std::string("expected an array of strings, found an element that is ") +
                    type_phrase(item.type()) + " (" + show_value(item) + ")");
    }
    values.push_back(item.as_string().str);
  }
  out = std::move(values);
  return true;
}
#undef KOLOS_SECTION_VALUE

std::string toml_key_text(const std::string& key) {
  const bool bare = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
  });
  return bare ? key : quote_toml(key);
}

namespace {

// `v` on one line, tables inline with their keys sorted (a table's order
// is not kept, and the text must read back to itself).
std::string inline_text(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::string:
      return quote_toml(v.as_string().str);
    case toml::value_t::floating:
      return format_float(v.as_floating());
    case toml::value_t::array: {
      std::string out = "[";
      for (const auto& item : v.as_array()) out += (out.size() > 1 ? ", " : "") + inline_text(item);
      return out + "]";
    }
    case toml::value_t::table: {
      std::vector<std::string> keys;
      for (const auto& [k, item] : v.as_table()) keys.push_back(k);
      std::sort(keys.begin(), keys.end());
      std::string out = "{";
      for (const auto& k : keys) {
        out += (out.size() > 1 ? ", " : " ") + toml_key_text(k) + " = " + inline_text(v.as_table().at(k));
      }
      return out + (keys.empty() ? "}" : " }");
    }
    default: {
      std::ostringstream out;
      out << toml::format(v, 0);
      std::string s = out.str();
      while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
      return s;
    }
  }
}

}  // namespace

std::string ConfigSection::value_text(const std::string& key) const {
  const toml::value* v = value_at(*this, document_, full(key));
  // Written inside a plugin's inline table by to_toml: on one line.
  return v == nullptr ? "" : inline_text(*v);
}

void ConfigSection::fail(const std::string& key, const std::string& message) const {
  kolos::fail(doc_of(document_).origin_of(full(key)), full(key) + ": " + message);
}

void ConfigSection::fail_at_any(const std::vector<std::string>& keys,
                                const std::string& message) const {
  std::vector<std::string> full_keys;
  for (const auto& k : keys) full_keys.push_back(full(k));
  if (full_keys.empty()) full_keys.push_back(path_);
  kolos::fail(doc_of(document_).origin_of_any(full_keys), message);
}

void ConfigSection::fail_here(const std::string& message) const {
  kolos::fail(path_.empty() ? Origin{source(), ""} : doc_of(document_).origin_of(path_), message);
}

void ConfigSection::check_keys(const std::vector<std::string>& valid,
                               const std::string& owner) const {
  for (const auto& key : keys()) {
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) continue;
    const std::string name = full(key);
    if (path_.empty()) {  // the document's top level: sections
      std::string message =
          "unknown section `" + name + "`; valid sections: " + join(valid, ", ") + ".";
      const std::string match = closest_match(key, valid);
      if (!match.empty()) message += " Did you mean `" + match + "`?";
      kolos::fail(doc_of(document_).origin_of(name, /*at_key=*/true), message);
    }
    std::string message = "unknown key `" + name + "`; ";
    const std::string where = path_.empty() ? "" : " in [" + path_ + "]";
    const std::string whose = owner.empty() ? "" : " (" + owner + ")";
    if (valid.empty()) {
      message += "there are no keys" + where + whose + ".";
    } else {
      message += "valid keys" + where + whose + ": " + join(valid, ", ") + ".";
      const std::string match = closest_match(key, valid);
      if (!match.empty()) message += " Did you mean `" + match + "`?";
    }
    kolos::fail(doc_of(document_).origin_of(name, /*at_key=*/true), message);
  }
}

int64_t parse_byte_size(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  size_t end = pos;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) ||
                               text[end] == '.' || text[end] == 'e' || text[end] == 'E' ||
                               ((text[end] == '+' || text[end] == '-') && end > pos &&
                                (text[end - 1] == 'e' || text[end - 1] == 'E')))) {
    ++end;
  }
  if (end == pos) throw std::invalid_argument("expected a size such as \"24GiB\" or \"512MiB\"");
  double value = 0;
  try {
    value = std::stod(text.substr(pos, end - pos));
  } catch (const std::exception&) {
    throw std::invalid_argument("expected a size such as \"24GiB\" or \"512MiB\"");
  }
  std::string unit;
  for (size_t i = end; i < text.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += text[i];
  }
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},          {"B", 1},          {"KiB", 1024.0},   {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = value * scale;
      if (bytes == 0) return 0;
      if (!(bytes >= 1) || bytes > 9e18) {
        throw std::invalid_argument("a size from 1 byte to 8 EiB (or 0) is needed");
      }
      return static_cast<int64_t>(bytes);
    }
  }
  throw std::invalid_argument("unknown unit \"" + unit +
                              "\"; valid: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB");
}

std::string located(const RunConfig& config, const std::string& key, const std::string& message) {
  const Origin origin = doc_of(config.document).origin_of(key);
  // The source line goes under the message's first line; the rest follows.
  const size_t end = message.find('\n');
  const std::string first = message.substr(0, end);
  const std::string rest = end == std::string::npos ? "" : message.substr(end);
  return origin.where + ": " + key + ": " + first + origin.snippet + rest;
}

}  // namespace kolos
