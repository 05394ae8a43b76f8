// The role interface the test plugins implement: small enough to show that
// an object made in a plugin works, and when it is destroyed.
#pragma once

#include <string>

namespace kolos_test {

struct Greeter {
  virtual ~Greeter() = default;
  virtual std::string hello() const = 0;
  // The object sets *flag = true in its destructor (nullptr: nothing).
  virtual void report_destruction_to(bool* flag) = 0;
  // Throws kolos::ConfigError(message) (a plugin's bad-input error).
  virtual void refuse(const std::string& message) const {}
};

}  // namespace kolos_test
