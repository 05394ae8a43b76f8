// The "--name value" options of the NVMe benchmarks: each option names
// where its value goes; a missing value or an unknown option ends the
// program through the benchmark's usage().
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace kolos::bench {

class Options {
 public:
  using Usage = void (*)(const char* why);
  explicit Options(Usage usage) : usage_(usage) {}

  Options& add(const char* name, std::string* out) { return add(name, out, nullptr, nullptr); }
  Options& add(const char* name, int64_t* out) { return add(name, nullptr, out, nullptr); }
  Options& add(const char* name, int* out) { return add(name, nullptr, nullptr, out); }

  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const Option* option = nullptr;
      for (const Option& o : options_) {
        if (arg == o.name) option = &o;
      }
      if (option == nullptr) usage_(("unknown option " + arg).c_str());
      if (i + 1 >= argc) usage_(("missing value after " + arg).c_str());
      const char* value = argv[++i];
      if (option->text != nullptr) *option->text = value;
      if (option->wide != nullptr) *option->wide = std::atoll(value);
      if (option->narrow != nullptr) *option->narrow = std::atoi(value);
    }
  }

 private:
  struct Option {
    std::string name;
    std::string* text;
    int64_t* wide;
    int* narrow;
  };
  Options& add(const char* name, std::string* text, int64_t* wide, int* narrow) {
    options_.push_back(Option{name, text, wide, narrow});
    return *this;
  }
  Usage usage_;
  std::vector<Option> options_;
};

}  // namespace kolos::bench
