// Settings: the generic reader of a run's TOML document, and key tables.
//
// The core owns the document (parsing, `--set` overrides, where each value
// came from) and the sections it uses itself; every plugin owns the keys of
// the section its role names (kolos/core/roles.h) and reads them through the
// same reader, so its messages have the same shape: an origin
// ("file:line:col", "file: --set key=value" or the file alone), the key,
// what was found and what would be valid.
//
// A section's keys are declared once, in a SettingsTable: one row per key
// (name, type, range or choices, the struct member it fills). The table
// reads a section (unknown keys first, in file order, with a "did you mean";
// then types; then ranges) and writes the values back as TOML. Rules that
// involve several keys are written next to the table, by its owner.
//
// Torch-free: cheap to include from plugins' settings and from tools.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace kolos {

class ConfigDocument;  // a parsed run document with overrides (config/section.cpp)

// One table of a run's document ("model", "parallel.pipeline"). A default
// constructed section, or one whose table is absent, has no keys: reads
// leave their outputs unchanged. Copies share the document.
class ConfigSection {
 public:
  ConfigSection() = default;
  ConfigSection(std::shared_ptr<const ConfigDocument> document, std::string path);

  const std::string& path() const { return path_; }
  // The file the document was read from ("<config>" for one built in code).
  std::string source() const;
  bool present() const;  // the table exists in the document
  bool has(const std::string& key) const;
  // The keys present, in file order (keys given by `--set` last).
  std::vector<std::string> keys() const;
  // The sub-table `key` (which may be absent).
  ConfigSection sub(const std::string& key) const;

  // Typed reads of `key` (relative to this section). Absent: returns false
  // and leaves `out` as it is. Wrong type: throws ConfigError at the value.
  bool read(const std::string& key, int64_t& out) const;
  bool read(const std::string& key, double& out) const;  // integers accepted
  bool read(const std::string& key, bool& out) const;
  bool read(const std::string& key, std::string& out) const;
  bool read(const std::string& key, std::vector<int64_t>& out) const;
  bool read(const std::string& key, std::vector<std::string>& out) const;
  // The value of `key` as TOML text ("" when absent), for writing back.
  std::string value_text(const std::string& key) const;

  // Throws ConfigError "<origin of key>: <section>.<key>: <message>".
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  // Throws ConfigError "<origin of the first present key>: <message>" (the
  // message names the keys itself); rules that involve several keys.
  [[noreturn]] void fail_at_any(const std::vector<std::string>& keys,
                                const std::string& message) const;
  // Throws ConfigError at this section's own origin (or the file's).
  [[noreturn]] void fail_here(const std::string& message) const;
  // Unknown keys: the first present key (in file order) not in `valid` is
  // reported with the valid keys and a "did you mean". `owner` (optional)
  // says whose keys they are ("layers plugin `tp2d`").
  void check_keys(const std::vector<std::string>& valid, const std::string& owner = "") const;

 private:
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  std::shared_ptr<const ConfigDocument> document_;
  std::string path_;
};

// How values are shown in messages and written back.
std::string quote_toml(const std::string& s);
std::string format_float(double x);  // shortest form that reads back the same, always a float
std::string join(const std::vector<std::string>& items, const std::string& sep, bool quote = false);
// Levenshtein-based suggestion: the candidate closest to `word`, or "" when
// none is close enough. Used by every "did you mean" message.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
// "24GiB", "512 MiB", "2e9" (bytes), "1.5TB", "0": bytes. Throws
// std::invalid_argument saying what is wrong.
int64_t parse_byte_size(const std::string& text);

// The keys of one section, declared once: reading, checking, writing back.
template <typename T>
class SettingsTable {
 public:
  explicit SettingsTable(std::string section) : section_(std::move(section)) {}

  const std::string& section() const { return section_; }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const auto& row : rows_) out.push_back(row.key);
    return out;
  }

  // An integer in [min, max].
  SettingsTable& integer(std::string key, int64_t T::*member, int64_t min = kMinInt,
                         int64_t max = kMaxInt) {
    Row row{std::move(key)};
    row.read = [member, min, max](const ConfigSection& s, const std::string& k, T& out) {
      if (!s.read(k, out.*member)) return;
      const int64_t v = out.*member;
      if (v < min) {
        s.fail(k,
               std::to_string(v) + " is out of range; it must be >= " + std::to_string(min) + ".");
      }
      if (v > max) {
        s.fail(k,
               std::to_string(v) + " is out of range; it must be <= " + std::to_string(max) + ".");
      }
    };
    row.write = [member](const T& value) { return std::to_string(value.*member); };
    rows_.push_back(std::move(row));
    return *this;
  }

  // A number; `check` (optional) returns "" or what the range is ("> 0").
  SettingsTable& number(std::string key, double T::*member,
                        std::function<std::string(double)> check = {}) {
    Row row{std::move(key)};
    row.read = [member, check](const ConfigSection& s, const std::string& k, T& out) {
      if (!s.read(k, out.*member)) return;
      if (!check) return;
      const std::string must = check(out.*member);
      if (!must.empty()) {
        s.fail(k, format_float(out.*member) + " is out of range; it must be " + must + ".");
      }
    };
    row.write = [member](const T& value) { return format_float(value.*member); };
    rows_.push_back(std::move(row));
    return *this;
  }

  // A size as a string with a unit ("24GiB", "512MiB", "2e9"), in bytes.
  SettingsTable& bytes(std::string key, int64_t T::*member) {
    Row row{std::move(key)};
    row.read = [member](const ConfigSection& s, const std::string& k, T& out) {
      std::string text;
      if (!s.read(k, text)) return;
      try {
        out.*member = parse_byte_size(text);
      } catch (const std::invalid_argument& e) {
        s.fail(k, quote_toml(text) + ": " + e.what() + ".");
      }
    };
    row.write = [member](const T& value) { return quote_toml(std::to_string(value.*member) + "B"); };
    rows_.push_back(std::move(row));
    return *this;
  }

  SettingsTable& boolean(std::string key, bool T::*member) {
    Row row{std::move(key)};
    row.read = [member](const ConfigSection& s, const std::string& k, T& out) {
      s.read(k, out.*member);
    };
    row.write = [member](const T& value) { return value.*member ? "true" : "false"; };
    rows_.push_back(std::move(row));
    return *this;
  }

  SettingsTable& string(std::string key, std::string T::*member) {
    Row row{std::move(key)};
    row.read = [member](const ConfigSection& s, const std::string& k, T& out) {
      s.read(k, out.*member);
    };
    row.write = [member](const T& value) { return quote_toml(value.*member); };
    rows_.push_back(std::move(row));
    return *this;
  }

  // One of `choices`; `what` names the kind ("pipeline schedule").
  SettingsTable& choice(std::string key, std::string T::*member, std::vector<std::string> choices,
                        std::string what) {
    Row row{std::move(key)};
    row.read = [member, choices, what](const ConfigSection& s, const std::string& k, T& out) {
      if (!s.read(k, out.*member)) return;
      const std::string& v = out.*member;
      for (const auto& c : choices) {
        if (c == v) return;
      }
      const std::string match = closest_match(v, choices);
      s.fail(k, quote_toml(v) + " is not a valid " + what +
                    "; valid: " + join(choices, ", ", true) + "." +
                    (match.empty() ? "" : " Did you mean \"" + match + "\"?"));
    };
    row.write = [member](const T& value) { return quote_toml(value.*member); };
    rows_.push_back(std::move(row));
    return *this;
  }

  // An array of integers, each >= min; `what` names an element ("block count").
  SettingsTable& integers(std::string key, std::vector<int64_t> T::*member, int64_t min,
                          std::string what) {
    Row row{std::move(key)};
    row.read = [member, min, what](const ConfigSection& s, const std::string& k, T& out) {
      std::vector<int64_t> values;
      if (!s.read(k, values)) return;
      for (const int64_t v : values) {
        if (v < min) {
          s.fail(k, "expected an array of integers >= " + std::to_string(min) + " (" + what +
                        "), found an element " + std::to_string(v));
        }
      }
      out.*member = std::move(values);
    };
    row.write = [member](const T& value) {
      std::string text = "[";
      const auto& v = value.*member;
      for (size_t i = 0; i < v.size(); ++i) text += (i ? ", " : "") + std::to_string(v[i]);
      return text + "]";
    };
    rows_.push_back(std::move(row));
    return *this;
  }

  SettingsTable& strings(std::string key, std::vector<std::string> T::*member) {
    Row row{std::move(key)};
    row.read = [member](const ConfigSection& s, const std::string& k, T& out) {
      s.read(k, out.*member);
    };
    row.write = [member](const T& value) {
      std::vector<std::string> quoted;
      for (const auto& item : value.*member) quoted.push_back(quote_toml(item));
      return "[" + join(quoted, ", ") + "]";
    };
    rows_.push_back(std::move(row));
    return *this;
  }

  // A copy without the rows of `keys` (e.g. keys a model derives).
  SettingsTable without(const std::vector<std::string>& keys) const {
    SettingsTable out(section_);
    for (const auto& row : rows_) {
      if (std::find(keys.begin(), keys.end(), row.key) == keys.end()) out.rows_.push_back(row);
    }
    return out;
  }
  // A copy with `more`'s rows after this table's.
  SettingsTable then(const SettingsTable& more) const {
    SettingsTable out = *this;
    out.rows_.insert(out.rows_.end(), more.rows_.begin(), more.rows_.end());
    return out;
  }

  // Reads `section` into `out`: unknown keys (besides `other_keys`, keys of
  // the same table that another owner reads) first, then each row in order.
  void read(const ConfigSection& section, T& out, const std::vector<std::string>& other_keys = {},
            const std::string& owner = "") const {
    std::vector<std::string> valid = other_keys;
    for (const auto& row : rows_) valid.push_back(row.key);
    section.check_keys(valid, owner);
    for (const auto& row : rows_) row.read(section, row.key, out);
  }

  // Reads the rows present in `section` without the unknown-key check: for
  // a table whose other keys another owner reads and checks.
  void read_rows(const ConfigSection& section, T& out) const {
    for (const auto& row : rows_) row.read(section, row.key, out);
  }

  // "key = value" lines, in table order.
  void write(const T& value, std::ostream& out) const {
    for (const auto& row : rows_) out << row.key << " = " << row.write(value) << "\n";
  }
  // "key = value, key = value" (inside an inline table).
  std::string write_inline(const T& value) const {
    std::string out;
    for (const auto& row : rows_) out += ", " + row.key + " = " + row.write(value);
    return out;
  }

 private:
  static constexpr int64_t kMinInt = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
  struct Row {
    std::string key;
    std::function<void(const ConfigSection&, const std::string&, T&)> read;
    std::function<std::string(const T&)> write;
  };
  std::string section_;
  std::vector<Row> rows_;
};

}  // namespace kolos
