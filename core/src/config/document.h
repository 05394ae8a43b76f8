// ConfigDocument: a run's TOML document after `--set` overrides, and where
// each value came from. Private to core/src/config.
#pragma once

#include <string>
#include <vector>

#include <toml.hpp>

namespace kolos {

struct Override {
  std::string text;  // as given, for messages: "parallel.tensor.size=2"
  std::string key;   // "parallel.tensor.size"
};

// Where a problem is: "file:line:col" plus the source line with a caret, or
// "file: --set key=value" for overrides, or just the file.
struct Origin {
  std::string where;
  std::string snippet;
};

class ConfigDocument {
 public:
  ConfigDocument(toml::value doc, std::string name, std::vector<Override> overrides)
      : doc_(std::move(doc)), name_(std::move(name)), overrides_(std::move(overrides)) {}

  const std::string& name() const { return name_; }
  const toml::value& root() const { return doc_; }
  // The value at dotted `key`, or nullptr.
  const toml::value* find(const std::string& key) const;
  // The origin of `key`: its value if present (the key itself when
  // `at_key`), else the closest enclosing table that is present.
  Origin origin_of(const std::string& key, bool at_key = false) const;
  // The origin of the first of `keys` that is present.
  Origin origin_of_any(const std::vector<std::string>& keys) const;
  // Keys of the table at `path` ("" for the root), in file order, keys that
  // came only from `--set` last.
  std::vector<std::string> keys_in_order(const std::string& path) const;

 private:
  bool from_file(const toml::value& v) const { return v.location().file_name() == name_; }
  const Override* override_for(const std::string& key) const;

  toml::value doc_;
  std::string name_;
  std::vector<Override> overrides_;
};

[[noreturn]] void fail(const Origin& origin, const std::string& message);
// "name:line:col" of a value in the file and its line with the value (or,
// given `key_word`, that key on the line) underlined.
Origin file_origin(const toml::source_location& loc, const std::string& name,
                   const std::string& key_word = "");
// "a.b.c" -> {"a", "b", "c"}; a trailing '.' gives a last empty part.
std::vector<std::string> split_key(const std::string& key);
const char* type_phrase(toml::value_t type);
std::string show_value(const toml::value& v);  // short, as the user wrote it
// A TOML key as written: bare when it may be (letters, digits, _ and -), quoted otherwise.
std::string toml_key_text(const std::string& key);

}  // namespace kolos
