// PluginLibrary: one open dlopen handle, closed when the last owner lets go.
//
// Private to core/src/plugin. Libraries are opened with RTLD_NOW (every
// undefined symbol is resolved at load time, so a plugin built against
// another kolos fails here, not in the middle of a run) and RTLD_LOCAL (a
// plugin's symbols never satisfy another plugin's, so two plugins may carry
// same-named internals).
#pragma once

#include <memory>
#include <string>

namespace kolos {

class PluginLibrary {
 public:
  // Opens `path`; throws PluginError "cannot load: <dlerror text>" on failure.
  static std::shared_ptr<PluginLibrary> open(const std::string& path);

  ~PluginLibrary();  // dlclose; never throws
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  // The address of `name`, or nullptr with dlerror()'s text in `*error`.
  void* symbol(const char* name, std::string* error) const;

  const std::string& path() const { return path_; }

 private:
  PluginLibrary(std::string path, void* handle) : path_(std::move(path)), handle_(handle) {}

  std::string path_;
  void* handle_;
};

}  // namespace kolos
