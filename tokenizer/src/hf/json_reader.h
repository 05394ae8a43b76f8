// Reading tokenizer.json: where a value sits (file and JSON path) and the
// typed getters that refuse what they cannot read, naming that path.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kolos/core/error.h"

namespace kolos::tokenizer::hf {

using Json = nlohmann::json;

// Where a value sits: the file and the JSON path, for error messages.
class Where {
 public:
  Where(std::string file, std::string path) : file_(std::move(file)), path_(std::move(path)) {}
  Where key(const std::string& k) const { return {file_, path_.empty() ? k : path_ + "." + k}; }
  Where index(size_t i) const { return {file_, path_ + "[" + std::to_string(i) + "]"}; }
  // "tokenizer.json: model.merges[3]"
  std::string str() const { return file_ + ": " + (path_.empty() ? "(top level)" : path_); }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& what) const { throw DataError(str() + " " + what); }

 private:
  std::string file_;
  std::string path_;
};

// `j` as JSON, cut to 80 characters for messages.
std::string short_dump(const Json& j);
// "a, b, c"
std::string join(const std::vector<std::string>& items);
// Refuses (kolos::DataError naming the key's path) any key of `object`
// outside `known`, and an `object` that is not an object.
void check_keys(const Json& object, const Where& where, const std::vector<std::string>& known);
// The value at `key`; `fallback` / nullopt when absent or null; refuses
// another type.
bool get_bool(const Json& object, const char* key, const Where& where, bool fallback);
std::optional<std::string> get_string(const Json& object, const char* key, const Where& where);
// object["type"], required.
std::string get_type(const Json& object, const Where& where);
// Throws "<where>.type = "X" is not supported; supported: ...".
[[noreturn]] void unsupported_type(const Where& where, const std::string& type,
                                   const std::vector<std::string>& supported);

}  // namespace kolos::tokenizer::hf
