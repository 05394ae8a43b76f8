// The one error hierarchy of kolos.
//
// Every failure that a user can cause or see is a kolos::Error (or one of its
// kinds). Messages read like a good compiler's: where (file:line, key, rank),
// what was found, what would be valid. Check macros add the source location
// of the check and, once the runtime is up, the rank that raised it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kolos {

enum class ErrorKind { kGeneric, kConfig, kPlugin, kComm, kData, kCheckpoint, kUsage };

const char* to_string(ErrorKind kind);

// The error classes' vtables and type information live in libkolos_base
// (each has an out-of-line destructor there) and are exported from it, so
// an error thrown by a plugin stays valid, and is caught by its type, after
// the plugin's library is unloaded (an exception from a plugin's object
// unwinds past that object, often its library's last holder).
#define KOLOS_ERROR_API __attribute__((visibility("default")))

class KOLOS_ERROR_API Error : public std::runtime_error {
 public:
  explicit Error(std::string message, ErrorKind kind = ErrorKind::kGeneric)
      : std::runtime_error(std::move(message)), kind_(kind) {}
  ~Error() override;
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// A bad configuration: malformed TOML, unknown key, wrong type, out of range,
// a mesh that does not divide the world.
class KOLOS_ERROR_API ConfigError : public Error {
 public:
  explicit ConfigError(std::string message) : Error(std::move(message), ErrorKind::kConfig) {}
  ~ConfigError() override;
};

// A plugin that cannot be found, loaded or used.
class KOLOS_ERROR_API PluginError : public Error {
 public:
  explicit PluginError(std::string message) : Error(std::move(message), ErrorKind::kPlugin) {}
  ~PluginError() override;
};

// A failed or timed-out collective / point-to-point operation.
class KOLOS_ERROR_API CommError : public Error {
 public:
  explicit CommError(std::string message) : Error(std::move(message), ErrorKind::kComm) {}
  ~CommError() override;
};

// Bad training data: missing file, too short, token out of vocabulary.
class KOLOS_ERROR_API DataError : public Error {
 public:
  explicit DataError(std::string message) : Error(std::move(message), ErrorKind::kData) {}
  ~DataError() override;
};

// Wrong use of the command line.
class KOLOS_ERROR_API UsageError : public Error {
 public:
  explicit UsageError(std::string message) : Error(std::move(message), ErrorKind::kUsage) {}
  ~UsageError() override;
};

namespace detail {

// Rank prefix used by check macros; -1 until the runtime knows its rank.
int current_rank() noexcept;
void set_current_rank(int rank) noexcept;

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

[[noreturn]] void throw_check_failure(ErrorKind kind, const char* file, int line,
                                      const char* condition, const std::string& message);

}  // namespace detail
}  // namespace kolos

// KOLOS_CHECK(cond, msg...): throws kolos::Error naming the check and location.
#define KOLOS_CHECK(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      ::kolos::detail::throw_check_failure(::kolos::ErrorKind::kGeneric, __FILE__, __LINE__, \
                                           #cond, ::kolos::detail::concat(__VA_ARGS__));    \
    }                                                                                       \
  } while (0)

// KOLOS_CHECK_KIND(kind, cond, msg...): as KOLOS_CHECK with an error kind.
#define KOLOS_CHECK_KIND(kind, cond, ...)                                                   \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      ::kolos::detail::throw_check_failure(::kolos::ErrorKind::kind, __FILE__, __LINE__,     \
                                           #cond, ::kolos::detail::concat(__VA_ARGS__));    \
    }                                                                                       \
  } while (0)

// KOLOS_CHECK_EQ(a, b, msg...): prints both values on failure.
#define KOLOS_CHECK_EQ(a, b, ...)                                                              \
  do {                                                                                         \
    const auto& kolos_a_ = (a);                                                                \
    const auto& kolos_b_ = (b);                                                                \
    if (!(kolos_a_ == kolos_b_)) {                                                             \
      ::kolos::detail::throw_check_failure(                                                    \
          ::kolos::ErrorKind::kGeneric, __FILE__, __LINE__, #a " == " #b,                      \
          ::kolos::detail::concat(#a " is ", kolos_a_, ", " #b " is ", kolos_b_, ". ",         \
                                  ##__VA_ARGS__));                                             \
    }                                                                                          \
  } while (0)
