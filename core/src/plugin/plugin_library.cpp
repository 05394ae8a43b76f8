#include "plugin_library.h"

#include <dlfcn.h>

#include <mutex>

#include "kolos/core/error.h"

namespace kolos {
namespace {

// dlerror() keeps its message in one per-thread slot that any dl* call
// overwrites; the lock keeps "call, then read the message" one step when
// several threads load plugins at once (glibc's slot is per thread, other
// libcs are not).
std::mutex& dl_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::string last_dl_error() {
  const char* text = dlerror();
  return text != nullptr ? text : "unknown dlerror";
}

}  // namespace

std::shared_ptr<PluginLibrary> PluginLibrary::open(const std::string& path) {
  std::lock_guard<std::mutex> lock(dl_mutex());
  dlerror();  // clear a stale message
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  // dlerror() names the file itself ("<path>: invalid ELF header").
  if (handle == nullptr) throw PluginError("cannot load: " + last_dl_error());
  return std::shared_ptr<PluginLibrary>(new PluginLibrary(path, handle));
}

PluginLibrary::~PluginLibrary() {
  std::lock_guard<std::mutex> lock(dl_mutex());
  dlclose(handle_);  // a failure here has no one to report to
}

void* PluginLibrary::symbol(const char* name, std::string* error) const {
  std::lock_guard<std::mutex> lock(dl_mutex());
  dlerror();
  void* address = dlsym(handle_, name);
  if (address == nullptr && error != nullptr) *error = last_dl_error();
  return address;
}

}  // namespace kolos
