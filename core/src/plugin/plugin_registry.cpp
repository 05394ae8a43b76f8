#include "kolos/core/plugin_registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "kolos/core/error.h"
#include "kolos/core/run_config.h"  // closest_match
#include "plugin_library.h"
#include "plugin_stamp.h"

namespace kolos {

namespace fs = std::filesystem;

namespace detail {
// A library whose descriptor this core accepts, with that descriptor.
struct LoadedPlugin {
  std::shared_ptr<PluginLibrary> library;
  const kolos_plugin_descriptor* descriptor = nullptr;
};
}  // namespace detail
using detail::LoadedPlugin;

// Keeps acceptable libraries open so that scan() followed by create() (the
// usual order: validate a run's plugins, then build them) opens each once.
// Refused libraries are closed at once and not kept.
struct PluginRegistry::Cache {
  std::mutex mutex;
  std::map<std::string, LoadedPlugin> by_path;
};

namespace {

constexpr std::size_t kCreateErrorLength = 4096;
constexpr std::string_view kFilePrefix = "libkolos_";
constexpr std::string_view kFileSuffix = ".so";

// One scanned file: what scan() reports, and the loaded plugin when usable.
struct Candidate {
  PluginInfo info;
  LoadedPlugin loaded;
};

std::string or_empty(const char* text) { return text != nullptr ? text : ""; }

std::string torch_refusal(const std::string& plugin_torch) {
  return "built for LibTorch " + plugin_torch + ", this kolos uses LibTorch " KOLOS_TORCH_VERSION;
}

bool is_known_role(const std::string& role) {
  return std::any_of(role_specs().begin(), role_specs().end(),
                     [&](const RoleSpec& known) { return role == known.name; });
}

std::string role_list() {
  std::string out;
  for (const auto& role : role_names()) out += (out.empty() ? "" : ", ") + role;
  return out;
}

// "/a/b/" and "/a/b" are one directory; "" stays "".
std::string normalize(const std::string& dir) {
  fs::path path = fs::path(dir).lexically_normal();
  if (!path.has_filename() && path.has_relative_path()) path = path.parent_path();
  return path.string();
}

// The identity used to drop duplicates: symlinks and ".." resolved as far
// as the directory exists.
std::string directory_key(const std::string& dir) {
  std::error_code error;
  const fs::path canonical = fs::weakly_canonical(dir, error);
  return error ? dir : normalize(canonical.string());
}

std::vector<std::string> split_path_list(const char* value) {
  std::vector<std::string> entries;
  if (value == nullptr) return entries;
  std::istringstream in(value);
  for (std::string entry; std::getline(in, entry, ':');) {
    if (!entry.empty()) entries.push_back(entry);
  }
  return entries;
}

// The running executable (symlinks resolved), or "" when it cannot be found.
fs::path running_executable() {
  std::error_code error;
  const fs::path executable = fs::read_symlink("/proc/self/exe", error);
  return error ? fs::path() : executable;
}

// <prefix>/KOLOS_PLUGIN_INSTALL_SUBDIR for an executable at <prefix>/bin/x,
// or "" when the running executable is unknown.
std::string install_plugin_dir(const fs::path& executable) {
  if (executable.empty()) return "";
  const fs::path subdir = KOLOS_PLUGIN_INSTALL_SUBDIR;
  if (subdir.is_absolute()) return normalize(subdir.string());
  return normalize((executable.parent_path().parent_path() / subdir).string());
}

// The build tree's plugin directory, only for an executable that runs from
// the build tree's bin directory (KOLOS_BUILD_RUNTIME_DIR, recorded at
// configure time). An installed binary carries the same config.h but runs
// from elsewhere, so it never searches (or loads from) a build folder that
// happens to exist on the machine. "" when the executable is not the build
// tree's or the build tree is gone.
std::string build_plugin_dir(const fs::path& executable) {
  if (executable.empty() || std::string(KOLOS_PLUGIN_BUILD_DIR).empty()) return "";
  std::error_code error;
  const bool in_build_tree =
      fs::equivalent(executable.parent_path(), fs::path(KOLOS_BUILD_RUNTIME_DIR), error);
  return !error && in_build_tree ? std::string(KOLOS_PLUGIN_BUILD_DIR) : "";
}

bool is_directory(const std::string& dir) {
  std::error_code error;
  return fs::is_directory(dir, error);
}

// Why `path` (a plugin file or a search directory) is not trusted: "" when
// it is, else "<path> is world-writable (mode 0777)" or "<path> is owned by
// uid 1000, neither root nor this user (uid 0)". Loading a plugin runs its
// code in every rank, so anyone who can replace the file, or add one to the
// directory, could run code in the job. KOLOS_ALLOW_INSECURE_PLUGINS=1
// accepts such paths; each accepted one is reported on stderr once.
std::string distrust(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";  // missing: reported elsewhere
  std::ostringstream why;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (st.st_mode & S_IWOTH) {
    why << path << " is world-writable (mode " << mode << ")";
  } else if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
    why << path << " is owned by uid " << st.st_uid << ", neither root nor this user (uid "
        << ::geteuid() << ")";
  } else {
    return "";
  }
  const char* allow = std::getenv("KOLOS_ALLOW_INSECURE_PLUGINS");
  if (allow == nullptr || std::string(allow) != "1") {
    return why.str() + "; refused (set KOLOS_ALLOW_INSECURE_PLUGINS=1 to accept it)";
  }
  static std::mutex mutex;
  static std::set<std::string> reported;
  std::lock_guard<std::mutex> lock(mutex);
  if (reported.insert(path).second) {
    std::fprintf(stderr, "kolos: warning: %s; accepted because KOLOS_ALLOW_INSECURE_PLUGINS=1\n",
                 why.str().c_str());
  }
  return "";
}

// Every libkolos_*.so in `dir` (regular files, symlinks followed), sorted so
// that the choice between same-named plugins does not depend on the file
// system's listing order.
std::vector<std::string> plugin_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string file = it->path().filename().string();
    const bool matches =
        file.size() > kFilePrefix.size() + kFileSuffix.size() &&
        file.compare(0, kFilePrefix.size(), kFilePrefix) == 0 &&
        file.compare(file.size() - kFileSuffix.size(), kFileSuffix.size(), kFileSuffix) == 0;
    std::error_code type_error;
    if (matches && fs::is_regular_file(it->path(), type_error)) {
      files.push_back(it->path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

void fill_from_descriptor(const kolos_plugin_descriptor& descriptor, PluginInfo& info) {
  info.abi_version = descriptor.abi_version;
  // Past abi_version the layout is only known for our own ABI version.
  if (descriptor.abi_version != KOLOS_PLUGIN_ABI_VERSION) return;
  info.name = or_empty(descriptor.name);
  info.role = or_empty(descriptor.role);
  info.kolos_version = or_empty(descriptor.kolos_version);
  info.torch_version = or_empty(descriptor.torch_version);
  info.compiler = or_empty(descriptor.compiler);
  info.description = or_empty(descriptor.description);
}

// Opens `path` (or takes it from the cache) and fills in what its descriptor
// says; `loaded` is set only when the descriptor is acceptable.
Candidate inspect(const std::string& path, const std::string& dir_distrust, std::mutex& mutex,
                  std::map<std::string, LoadedPlugin>& cache) {
  Candidate candidate;
  candidate.info.path = path;
  // Neither opened nor kept: dlopen() already runs the library's constructors.
  candidate.info.refusal = dir_distrust.empty() ? distrust(path) : dir_distrust;
  if (!candidate.info.refusal.empty()) return candidate;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto hit = cache.find(path);
    if (hit != cache.end()) {
      candidate.loaded = hit->second;
      fill_from_descriptor(*candidate.loaded.descriptor, candidate.info);
      candidate.info.usable = true;
      return candidate;
    }
  }
  // Built against another LibTorch: refused unopened (plugin_abi.h says why).
  const std::map<std::string, std::string> stamp = read_plugin_stamp(path);
  const auto torch = stamp.find("torch");
  if (torch != stamp.end() && torch->second != KOLOS_TORCH_VERSION) {
    // Unloaded, its descriptor is unread: the name is the file's
    // (libkolos_<name>.so), so that asking for it by name says why.
    const std::string file = fs::path(path).filename().string();
    candidate.info.name =
        file.substr(kFilePrefix.size(), file.size() - kFilePrefix.size() - kFileSuffix.size());
    candidate.info.torch_version = torch->second;
    if (stamp.count("kolos")) candidate.info.kolos_version = stamp.at("kolos");
    candidate.info.refusal = torch_refusal(torch->second) + " (not loaded)";
    return candidate;
  }
  std::shared_ptr<PluginLibrary> library;
  try {
    library = PluginLibrary::open(path);
  } catch (const PluginError& e) {
    candidate.info.refusal = e.what();
    return candidate;
  }
  std::string error;
  void* entry = library->symbol(KOLOS_PLUGIN_ENTRY_SYMBOL, &error);
  if (entry == nullptr) {
    candidate.info.refusal = "no `" KOLOS_PLUGIN_ENTRY_SYMBOL
                             "` symbol, so not a kolos plugin (define one with "
                             "KOLOS_DEFINE_PLUGIN): " +
                             error;
    return candidate;
  }
  const kolos_plugin_descriptor* descriptor = reinterpret_cast<kolos_plugin_entry_fn>(entry)();
  if (descriptor == nullptr) {
    candidate.info.refusal = "`" KOLOS_PLUGIN_ENTRY_SYMBOL "` returned NULL, not a descriptor";
    return candidate;
  }
  fill_from_descriptor(*descriptor, candidate.info);
  candidate.info.refusal = PluginRegistry::check_descriptor(*descriptor);
  if (candidate.info.refusal.empty()) {
    candidate.info.usable = true;
    candidate.loaded = LoadedPlugin{std::move(library), descriptor};
  }
  return candidate;
}

std::string searched_list(const std::vector<std::string>& search_path) {
  std::string out;
  for (const std::string& dir : search_path) {
    out += (out.empty() ? "" : ", ") + dir;
    if (!is_directory(dir)) out += " (does not exist)";
  }
  return out.empty() ? "(no directories)" : out;
}

// The message for "no usable plugin `name`": where it looked, what it found,
// what it refused and why, and the nearest found name.
std::string not_found_message(const std::string& role, const std::string& name,
                              const std::vector<std::string>& search_path,
                              const std::vector<Candidate>& candidates) {
  std::ostringstream out;
  const auto refused_same_name =
      std::find_if(candidates.begin(), candidates.end(),
                   [&](const Candidate& c) { return !c.info.usable && c.info.name == name; });
  if (refused_same_name != candidates.end()) {
    out << "plugin `" << name << "` for role `" << role
        << "` cannot be used: " << refused_same_name->info.path << ": "
        << refused_same_name->info.refusal;
  } else {
    out << "no plugin named `" << name << "` for role `" << role << "`";
  }
  out << "\n  searched: " << searched_list(search_path);

  std::vector<std::string> found_names;
  std::string found;
  std::string refused;
  for (const Candidate& c : candidates) {
    if (c.info.usable) {
      found += (found.empty() ? "" : ", ") + c.info.name + " (" + c.info.role + ")";
      found_names.push_back(c.info.name);
    } else {
      refused += "\n    " + c.info.path + ": " + c.info.refusal;
    }
  }
  out << "\n  found: " << (found.empty() ? "no usable plugin" : found);
  if (!refused.empty()) out << "\n  refused:" << refused;
  const std::string suggestion = closest_match(name, found_names);
  if (!suggestion.empty()) out << "\n  did you mean `" << suggestion << "`?";
  return out.str();
}

}  // namespace

PluginRegistry::PluginRegistry(std::vector<std::string> config_paths)
    : cache_(std::make_shared<Cache>()) {
  std::vector<std::string> wanted;
  for (const std::string& dir : config_paths) {
    if (!dir.empty()) wanted.push_back(dir);
  }
  for (const std::string& dir : split_path_list(std::getenv("KOLOS_PLUGIN_PATH"))) {
    wanted.push_back(dir);
  }
  const fs::path executable = running_executable();
  const std::string install_dir = install_plugin_dir(executable);
  if (!install_dir.empty()) wanted.push_back(install_dir);
  const std::string build_dir = build_plugin_dir(executable);
  if (!build_dir.empty()) wanted.push_back(build_dir);

  std::set<std::string> seen;
  for (const std::string& dir : wanted) {
    if (seen.insert(directory_key(dir)).second) search_path_.push_back(normalize(dir));
  }
}

std::string PluginRegistry::check_descriptor(const kolos_plugin_descriptor& descriptor) {
  std::ostringstream out;
  if (descriptor.abi_version != KOLOS_PLUGIN_ABI_VERSION) {
    out << "built for plugin ABI version " << descriptor.abi_version
        << ", this kolos reads plugin ABI version " << KOLOS_PLUGIN_ABI_VERSION
        << " (rebuild the plugin against this kolos)";
    return out.str();
  }
  const std::pair<const char*, bool> required[] = {
      {"name", descriptor.name != nullptr},
      {"role", descriptor.role != nullptr},
      {"kolos_version", descriptor.kolos_version != nullptr},
      {"torch_version", descriptor.torch_version != nullptr},
      {"create", descriptor.create != nullptr},
      {"destroy", descriptor.destroy != nullptr}};
  for (const auto& [field, present] : required) {
    if (!present) return std::string("descriptor field `") + field + "` is NULL";
  }
  if (std::string(descriptor.kolos_version) != KOLOS_VERSION) {
    out << "built for kolos " << descriptor.kolos_version << ", this is kolos " << KOLOS_VERSION;
    return out.str();
  }
  if (std::string(descriptor.torch_version) != KOLOS_TORCH_VERSION) {
    return torch_refusal(descriptor.torch_version);
  }
  if (descriptor.name[0] == '\0') return "descriptor has an empty name";
  const std::string role = descriptor.role;
  if (!is_known_role(role)) {
    out << "unknown role `" << role << "` (roles: " << role_list() << ")";
    const std::string suggestion = closest_match(role, role_names());
    if (!suggestion.empty()) out << "; did you mean `" << suggestion << "`?";
    return out.str();
  }
  return "";
}

namespace {

// Inspects every plugin file in search order; a usable plugin whose name an
// earlier usable one took is refused as shadowed (and not kept open).
std::vector<Candidate> scan_candidates(const std::vector<std::string>& search_path,
                                       std::mutex& mutex,
                                       std::map<std::string, LoadedPlugin>& cache) {
  std::vector<Candidate> candidates;
  std::map<std::string, std::string> first_path_by_name;
  for (const std::string& dir : search_path) {
    if (!is_directory(dir)) continue;
    const std::string dir_distrust = distrust(dir);
    for (const std::string& path : plugin_files(dir)) {
      Candidate candidate = inspect(path, dir_distrust, mutex, cache);
      if (candidate.info.usable) {
        auto [first, inserted] = first_path_by_name.emplace(candidate.info.name, path);
        if (inserted) {
          std::lock_guard<std::mutex> lock(mutex);
          cache.emplace(path, candidate.loaded);
        } else {
          candidate.info.usable = false;
          candidate.info.refusal = "shadowed by " + first->second + ", a plugin named `" +
                                   candidate.info.name + "` earlier in the search path";
          candidate.loaded = LoadedPlugin{};
        }
      }
      candidates.push_back(std::move(candidate));
    }
  }
  return candidates;
}

}  // namespace

std::vector<PluginInfo> PluginRegistry::scan() const {
  std::vector<PluginInfo> infos;
  for (Candidate& candidate : scan_candidates(search_path_, cache_->mutex, cache_->by_path)) {
    infos.push_back(std::move(candidate.info));
  }
  return infos;
}

std::shared_ptr<void> PluginRegistry::create_object(const std::string& role,
                                                    const std::string& name) const {
  if (!is_known_role(role)) {
    throw PluginError("no role `" + role + "` to create plugin `" + name +
                      "` for (roles: " + role_list() + ")");
  }
  const std::vector<Candidate> candidates =
      scan_candidates(search_path_, cache_->mutex, cache_->by_path);
  const auto chosen = std::find_if(candidates.begin(), candidates.end(), [&](const Candidate& c) {
    return c.info.usable && c.info.name == name;
  });
  if (chosen == candidates.end()) {
    throw PluginError(not_found_message(role, name, search_path_, candidates));
  }
  if (chosen->info.role != role) {
    std::string same_role;
    for (const Candidate& c : candidates) {
      if (c.info.usable && c.info.role == role)
        same_role += (same_role.empty() ? "" : ", ") + c.info.name;
    }
    throw PluginError("plugin `" + name + "` (" + chosen->info.path + ") serves role `" +
                      chosen->info.role + "`, not `" + role + "`; plugins for role `" + role +
                      "`: " + (same_role.empty() ? "none found" : same_role));
  }

  const LoadedPlugin loaded = chosen->loaded;
  char error[kCreateErrorLength] = {};
  void* object = loaded.descriptor->create(error, sizeof error);
  if (object == nullptr) {
    error[sizeof error - 1] = '\0';  // the plugin may not have terminated it
    throw PluginError("plugin `" + name + "` (" + chosen->info.path +
                      ") failed to create its object: " +
                      (error[0] != '\0' ? error : "create() returned NULL without a message"));
  }
  // The deleter owns the library: it stays loaded until `destroy` has run.
  auto destroy = loaded.descriptor->destroy;
  return std::shared_ptr<void>(object, [library = loaded.library, destroy](void* p) noexcept {
    try {
      destroy(p);
    } catch (...) {
      // A C entry point that throws is a plugin bug; a deleter must not throw.
    }
  });
}

}  // namespace kolos
