// The message of the error a call throws, for tests that check what it says.
#pragma once

#include <string>
#include <type_traits>

#include "kolos/core/error.h"

namespace kolos::testing {

// The what() of the E (a kolos::Error by default) that fn() throws, or
// "(no <E>)" when it throws none.
template <typename E = Error, typename Fn>
std::string message_of(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return std::is_same<E, ConfigError>::value ? "(no kolos::ConfigError)" : "(no kolos::Error)";
}

}  // namespace kolos::testing
