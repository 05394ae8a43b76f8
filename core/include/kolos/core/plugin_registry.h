// Plugin registry: finds, checks and loads strategy plugins by role and name.
//
// Search order: the TOML `[plugins] path` entries, then KOLOS_PLUGIN_PATH
// (colon-separated), then the install's lib/kolos/plugins (found relative to
// the running executable), then the build tree's plugin directory, the last
// only for an executable that runs from the build tree's bin directory (an
// installed binary searches its own tree and the configured paths). The first
// acceptable plugin of a name wins. A plugin whose ABI, kolos or LibTorch
// version differs from the core's is refused with a message naming both
// sides; a library that does not load or lacks `kolos_plugin_v1` is refused
// with dlerror()'s words. Every object a plugin creates keeps its library
// loaded (shared_ptr) for as long as it lives.
#pragma once

#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "kolos/config.h"
#include "kolos/core/plugin_abi.h"
#include "kolos/core/roles.h"

namespace kolos {

struct PluginInfo {
  std::string path;  // the .so file
  std::string name;
  std::string role;
  uint32_t abi_version = 0;
  std::string kolos_version;
  std::string torch_version;
  std::string compiler;
  std::string description;
  bool usable = false;
  std::string refusal;  // why it cannot be used; empty when usable
};

class PluginLibrary;  // an open dlopen handle (RAII)

class PluginRegistry {
 public:
  // `config_paths`: the TOML [plugins] path entries (searched first).
  explicit PluginRegistry(std::vector<std::string> config_paths = {});

  // The directories searched, in order.
  const std::vector<std::string>& search_path() const { return search_path_; }

  // Every libkolos_*.so found in the search path, usable or refused.
  // Also refuses a library whose name an earlier usable one already took
  // ("shadowed by ..."), so that exactly the usable entries are selectable.
  std::vector<PluginInfo> scan() const;

  // Loads plugin `name` and checks it serves `role`; creates its object.
  // Throws PluginError naming the directories searched and the plugins found
  // (with refusals) when there is no usable plugin of that name, naming both
  // roles when the plugin serves another role, and carrying the plugin's own
  // message when its create() fails. The object keeps its library loaded.
  // Thread-safe.
  template <typename Interface>
  std::shared_ptr<Interface> create(const std::string& role, const std::string& name) const {
    std::shared_ptr<void> object = create_object(role, name);
    return std::shared_ptr<Interface>(object, static_cast<Interface*>(object.get()));
  }

  std::shared_ptr<void> create_object(const std::string& role, const std::string& name) const;

  // Checks a descriptor against this core; returns "" when acceptable.
  static std::string check_descriptor(const kolos_plugin_descriptor& descriptor);

 private:
  struct Cache;  // acceptable libraries opened so far, by path (thread-safe)

  std::vector<std::string> search_path_;
  // Shared so that a copied registry shares what is already open; usable
  // libraries stay loaded while the registry (or an object they made) lives.
  std::shared_ptr<Cache> cache_;
};

// Renders scan() results for `kolos plugins`: one row per library (name,
// role, kolos and LibTorch versions, path), then its description, or
// "refused: <why>" for one that cannot be used.
std::string format_plugin_table(const std::vector<PluginInfo>& plugins);

namespace detail {
inline void copy_error(char* buffer, size_t length, const char* message) {
  if (buffer == nullptr || length == 0) return;
  std::strncpy(buffer, message, length - 1);
  buffer[length - 1] = '\0';
}
}  // namespace detail
}  // namespace kolos

// Defines the plugin's C entry point. `Impl` derives from `Interface`, the
// role's C++ interface, and is default-constructible.
#define KOLOS_DEFINE_PLUGIN(NAME, ROLE, Interface, Impl, DESCRIPTION) \
  KOLOS_DEFINE_PLUGIN_OF(NAME, ROLE, Interface, Impl, (), DESCRIPTION)

// The same for an `Impl` constructed from ARGS, a parenthesised argument
// list: several plugins that are one class in different modes, e.g.
//   KOLOS_DEFINE_PLUGIN_OF("tp2d", "layers", kolos::LayerFactory,
//                          kolos::tp::GridFactory, (kolos::tp::GridMode::k2d), "...")
#define KOLOS_DEFINE_PLUGIN_OF(NAME, ROLE, Interface, Impl, ARGS, DESCRIPTION)                 \
  namespace {                                                                                  \
  void* kolos_plugin_create(char* error, size_t error_len) {                                   \
    try {                                                                                      \
      Interface* object = new Impl ARGS;                                                       \
      return static_cast<void*>(object);                                                       \
    } catch (const std::exception& e) {                                                        \
      ::kolos::detail::copy_error(error, error_len, e.what());                                 \
    } catch (...) {                                                                            \
      ::kolos::detail::copy_error(error, error_len, "unknown exception");                      \
    }                                                                                          \
    return nullptr;                                                                            \
  }                                                                                            \
  void kolos_plugin_destroy(void* object) noexcept { delete static_cast<Interface*>(object); } \
  KOLOS_PLUGIN_STAMP(KOLOS_VERSION, KOLOS_TORCH_VERSION)                                       \
  const kolos_plugin_descriptor kolos_plugin_descriptor_{                                      \
      KOLOS_PLUGIN_ABI_VERSION, NAME,           ROLE,        KOLOS_VERSION,                    \
      KOLOS_TORCH_VERSION,      KOLOS_COMPILER, DESCRIPTION, &kolos_plugin_create,             \
      &kolos_plugin_destroy};                                                                  \
  }                                                                                            \
  extern "C" __attribute__((visibility("default"))) const kolos_plugin_descriptor*             \
  kolos_plugin_v1(void) {                                                                      \
    return &kolos_plugin_descriptor_;                                                          \
  }
