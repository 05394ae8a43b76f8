// PluginRegistry against real libraries built for the purpose (see
// CMakeLists.txt next door): what scan() reports, what create() makes, and
// every error message a user can meet on the way.
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "greeter.h"
#include "kolos/config.h"
#include "kolos/core/error.h"
#include "kolos/core/plugin_registry.h"

namespace kolos {
namespace {

namespace fs = std::filesystem;
using kolos_test::Greeter;
using ::testing::HasSubstr;

const std::string kGoodDir = KOLOS_TEST_GOOD_DIR;
const std::string kShadowDir = KOLOS_TEST_SHADOW_DIR;
const std::string kBadDir = KOLOS_TEST_BAD_DIR;

std::string good_plugin() { return kGoodDir + "/libkolos_testgood.so"; }

// Whether `path` is loaded in this process, without loading it.
bool is_loaded(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle != nullptr) dlclose(handle);  // NOLOAD still counted a reference
  return handle != nullptr;
}

// The message of the PluginError that `create_object` throws ("" if none).
std::string create_error(const PluginRegistry& registry, const std::string& role,
                         const std::string& name) {
  try {
    registry.create_object(role, name);
  } catch (const PluginError& e) {
    return e.what();
  }
  ADD_FAILURE() << "create_object(" << role << ", " << name << ") did not throw PluginError";
  return "";
}

std::map<std::string, PluginInfo> scan_by_file(const PluginRegistry& registry) {
  std::map<std::string, PluginInfo> by_file;
  for (PluginInfo& info : registry.scan()) {
    by_file[fs::path(info.path).filename().string()] = std::move(info);
  }
  return by_file;
}

// Every test starts without KOLOS_PLUGIN_PATH (CTest may set it for the real
// plugins) and leaves it as it found it.
class PluginRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* value = std::getenv("KOLOS_PLUGIN_PATH")) saved_path_ = value;
    unsetenv("KOLOS_PLUGIN_PATH");
  }
  void TearDown() override {
    if (saved_path_) {
      setenv("KOLOS_PLUGIN_PATH", saved_path_->c_str(), 1);
    } else {
      unsetenv("KOLOS_PLUGIN_PATH");
    }
  }

 private:
  std::optional<std::string> saved_path_;
};

TEST_F(PluginRegistryTest, ScanReportsEveryLibraryWithItsRefusal) {
  PluginRegistry registry({kGoodDir, kBadDir});
  const std::vector<PluginInfo> infos = registry.scan();
  // Search order first, then file names sorted within a directory.
  ASSERT_GE(infos.size(), 13u);  // 2 good, 11 bad (more if real plugins are built)
  EXPECT_EQ(infos[0].path, kGoodDir + "/libkolos_testgood.so");
  EXPECT_EQ(infos[1].path, kGoodDir + "/libkolos_testhandmade.so");
  EXPECT_EQ(infos[2].path, kBadDir + "/libkolos_emptyname.so");

  const auto by_file = scan_by_file(registry);
  const auto refusal = [&](const std::string& file) {
    const auto it = by_file.find(file);
    EXPECT_NE(it, by_file.end()) << file << " not scanned";
    if (it == by_file.end()) return std::string("<missing>");
    EXPECT_FALSE(it->second.usable) << file;
    return it->second.refusal;
  };

  const PluginInfo& good = by_file.at("libkolos_testgood.so");
  EXPECT_TRUE(good.usable);
  EXPECT_EQ(good.refusal, "");
  EXPECT_EQ(good.name, "testgood");
  EXPECT_EQ(good.role, "gradients");
  EXPECT_EQ(good.abi_version, KOLOS_PLUGIN_ABI_VERSION);
  EXPECT_EQ(good.kolos_version, KOLOS_VERSION);
  EXPECT_EQ(good.torch_version, KOLOS_TORCH_VERSION);
  EXPECT_EQ(good.compiler, KOLOS_COMPILER);
  EXPECT_EQ(good.description, "test plugin: says hello from testgood");
  EXPECT_TRUE(by_file.at("libkolos_testhandmade.so").usable);
  EXPECT_TRUE(by_file.at("libkolos_testthrows.so").usable);  // fails only at create()

  EXPECT_THAT(refusal("libkolos_junk.so"), HasSubstr("cannot load: "));
  EXPECT_THAT(refusal("libkolos_junk.so"), HasSubstr("libkolos_junk.so"));
  EXPECT_THAT(refusal("libkolos_unresolved.so"), HasSubstr("kolos_test_symbol_nobody_defines"));
  EXPECT_THAT(refusal("libkolos_noentry.so"), HasSubstr("no `kolos_plugin_v1` symbol"));
  EXPECT_THAT(refusal("libkolos_nulldescriptor.so"), HasSubstr("returned NULL"));
  EXPECT_EQ(refusal("libkolos_testabi.so"),
            "built for plugin ABI version 2, this kolos reads plugin ABI version 1 (rebuild the "
            "plugin against this kolos)");
  EXPECT_EQ(by_file.at("libkolos_testabi.so").abi_version, 2u);
  EXPECT_EQ(by_file.at("libkolos_testabi.so").name, "");  // not read past a foreign ABI
  EXPECT_EQ(refusal("libkolos_testoldkolos.so"),
            "built for kolos 0.0.9, this is kolos " KOLOS_VERSION);
  // Another LibTorch: from the build stamp, before loading (the library
  // aborts the process when loaded); from the descriptor when unstamped.
  EXPECT_EQ(refusal("libkolos_testoldtorch.so"),
            "built for LibTorch 1.12.0, this kolos uses LibTorch " KOLOS_TORCH_VERSION
            " (not loaded)");
  EXPECT_EQ(by_file.at("libkolos_testoldtorch.so").name, "testoldtorch");
  EXPECT_EQ(by_file.at("libkolos_testoldtorch.so").torch_version, "1.12.0");
  EXPECT_EQ(refusal("libkolos_testoldtorchunstamped.so"),
            "built for LibTorch 1.12.0, this kolos uses LibTorch " KOLOS_TORCH_VERSION);
  EXPECT_THAT(refusal("libkolos_testrole.so"), HasSubstr("unknown role `gradient`"));
  EXPECT_THAT(refusal("libkolos_testrole.so"), HasSubstr("did you mean `gradients`?"));
  EXPECT_EQ(refusal("libkolos_emptyname.so"), "descriptor has an empty name");
}

TEST_F(PluginRegistryTest, CreatesAnObjectThatKeepsItsLibraryLoaded) {
  std::shared_ptr<Greeter> greeter;
  bool destroyed = false;
  {
    PluginRegistry registry({kGoodDir});
    greeter = registry.create<Greeter>("gradients", "testgood");
    ASSERT_NE(greeter, nullptr);
    greeter->report_destruction_to(&destroyed);
  }
  // The registry (and its cache) is gone; the object alone holds the library.
  ASSERT_TRUE(is_loaded(good_plugin()));
  EXPECT_EQ(greeter->hello(), "hello from testgood");
  greeter.reset();
  EXPECT_TRUE(destroyed);  // destroyed by the plugin's own destroy()
  EXPECT_FALSE(is_loaded(good_plugin()));
}

TEST_F(PluginRegistryTest, AnErrorAPluginThrowsOutlivesItsLibrary) {
  // The object is the library's last holder: unwinding destroys it and
  // unloads the library before the handler runs. The error must still be
  // a readable ConfigError (its type and vtable belong to kolos_base, not
  // to the plugin).
  std::string message;
  try {
    std::shared_ptr<Greeter> greeter =
        PluginRegistry({kGoodDir}).create<Greeter>("gradients", "testgood");
    greeter->refuse("memory.compute_budget: too small");
    ADD_FAILURE() << "refuse() did not throw";
  } catch (const kolos::Error& e) {
    EXPECT_FALSE(is_loaded(good_plugin()));
    EXPECT_NE(dynamic_cast<const ConfigError*>(&e), nullptr);
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    message = e.what();
  }
  EXPECT_EQ(message, "memory.compute_budget: too small");
}

TEST_F(PluginRegistryTest, ScanThenCreateReusesTheOpenLibrary) {
  PluginRegistry registry({kGoodDir});
  registry.scan();
  EXPECT_TRUE(is_loaded(good_plugin()));  // kept by the registry's cache
  auto first = registry.create<Greeter>("gradients", "testgood");
  auto second = registry.create<Greeter>("gradients", "testgood");
  EXPECT_NE(first.get(), second.get());
  EXPECT_EQ(second->hello(), "hello from testgood");
}

TEST_F(PluginRegistryTest, CreateCarriesThePluginsOwnMessage) {
  PluginRegistry registry({kBadDir});
  const std::string message = create_error(registry, "gradients", "testthrows");
  EXPECT_THAT(message, HasSubstr("plugin `testthrows` (" + kBadDir + "/libkolos_testthrows.so)"));
  EXPECT_THAT(message, HasSubstr("failed to create its object: greeter construction failed on "
                                 "purpose"));
}

TEST_F(PluginRegistryTest, CreateReturningNullWithoutAMessageIsReported) {
  PluginRegistry registry({kGoodDir});
  EXPECT_THAT(create_error(registry, "layers", "testhandmade"),
              HasSubstr("create() returned NULL without a message"));
}

TEST_F(PluginRegistryTest, MissingNameSaysWhereItLookedWhatItFoundAndWhy) {
  const std::string missing_dir = kGoodDir + "/does-not-exist";
  PluginRegistry registry({missing_dir, kGoodDir, kBadDir});
  const std::string message = create_error(registry, "gradients", "testgod");
  EXPECT_THAT(message, HasSubstr("no plugin named `testgod` for role `gradients`"));
  EXPECT_THAT(message, HasSubstr("searched: " + missing_dir + " (does not exist), " + kGoodDir +
                                 ", " + kBadDir));
  EXPECT_THAT(message, HasSubstr(KOLOS_PLUGIN_BUILD_DIR));
  EXPECT_THAT(message, HasSubstr("found: testgood (gradients), testhandmade (layers)"));
  EXPECT_THAT(message, HasSubstr("testthrows (gradients)"));
  EXPECT_THAT(message, HasSubstr("refused:"));
  EXPECT_THAT(message, HasSubstr(kBadDir + "/libkolos_junk.so: cannot load: "));
  EXPECT_THAT(message, HasSubstr(kBadDir + "/libkolos_testoldkolos.so: built for kolos 0.0.9"));
  EXPECT_THAT(message, HasSubstr(kBadDir + "/libkolos_noentry.so: no `kolos_plugin_v1` symbol"));
  EXPECT_THAT(message, HasSubstr(kBadDir + "/libkolos_unresolved.so: cannot load: "));
  EXPECT_THAT(message, HasSubstr("did you mean `testgood`?"));

  // Nothing close: no suggestion.
  EXPECT_THAT(create_error(registry, "gradients", "qqqqqq"),
              ::testing::Not(HasSubstr("\n  did you mean")));
}

TEST_F(PluginRegistryTest, RefusedPluginAskedForByNameLeadsWithItsRefusal) {
  PluginRegistry registry({kBadDir});
  const std::string kolos_message = create_error(registry, "gradients", "testoldkolos");
  EXPECT_THAT(kolos_message,
              HasSubstr("plugin `testoldkolos` for role `gradients` cannot be used: " + kBadDir +
                        "/libkolos_testoldkolos.so: built for kolos 0.0.9, this is kolos " +
                        KOLOS_VERSION));
  EXPECT_THAT(kolos_message, HasSubstr("searched: " + kBadDir));
  EXPECT_THAT(
      create_error(registry, "gradients", "testoldtorch"),
      HasSubstr("built for LibTorch 1.12.0, this kolos uses LibTorch " KOLOS_TORCH_VERSION));
  EXPECT_THAT(create_error(registry, "gradients", "testrole"),
              HasSubstr("cannot be used: " + kBadDir + "/libkolos_testrole.so: unknown role"));
  // A foreign ABI's name is never read, so it is "not found", but listed.
  const std::string abi_message = create_error(registry, "gradients", "testabi");
  EXPECT_THAT(abi_message, HasSubstr("no plugin named `testabi`"));
  EXPECT_THAT(abi_message, HasSubstr("libkolos_testabi.so: built for plugin ABI version 2"));
}

TEST_F(PluginRegistryTest, RoleMismatchNamesBothRoles) {
  PluginRegistry registry({kGoodDir});
  const std::string message = create_error(registry, "layers", "testgood");
  EXPECT_THAT(message, HasSubstr("plugin `testgood` (" + good_plugin() +
                                 ") serves role `gradients`, not `layers`"));
  EXPECT_THAT(message, HasSubstr("plugins for role `layers`: testhandmade"));
  // The build tree's own plugins are on the path too: the planner's, when built.
  EXPECT_THAT(create_error(registry, "planner", "testgood"),
              HasSubstr("serves role `gradients`, not `planner`; plugins for role `planner`: "));
}

TEST_F(PluginRegistryTest, UnknownRoleAskedForIsAnError) {
  PluginRegistry registry({kGoodDir});
  const std::string message = create_error(registry, "gradient", "testgood");
  EXPECT_THAT(message, HasSubstr("no role `gradient`"));
  EXPECT_THAT(message, HasSubstr("layers, sequence, pipeline, gradients, memory, planner"));
}

TEST_F(PluginRegistryTest, HonoursKolosPluginPath) {
  setenv("KOLOS_PLUGIN_PATH", (":/nonexistent/kolos-plugins::" + kGoodDir + ":").c_str(), 1);
  PluginRegistry registry;
  const std::vector<std::string>& path = registry.search_path();
  ASSERT_GE(path.size(), 2u);
  EXPECT_EQ(path[0], "/nonexistent/kolos-plugins");  // kept, so messages show it
  EXPECT_EQ(path[1], kGoodDir);
  for (const std::string& dir : path) EXPECT_FALSE(dir.empty());
  EXPECT_EQ(registry.create<Greeter>("gradients", "testgood")->hello(), "hello from testgood");
}

// A private copy of the good plugin in a fresh directory, whose modes the
// trust tests change.
class UntrustedPluginTest : public PluginRegistryTest {
 protected:
  void SetUp() override {
    PluginRegistryTest::SetUp();
    unsetenv("KOLOS_ALLOW_INSECURE_PLUGINS");
    std::string pattern = (fs::temp_directory_path() / "kolos-trust-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    file_ = dir_ + "/libkolos_testgood.so";
    fs::copy_file(good_plugin(), file_);
    fs::permissions(file_, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  }
  void TearDown() override {
    unsetenv("KOLOS_ALLOW_INSECURE_PLUGINS");
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
    PluginRegistryTest::TearDown();
  }
  std::string dir_, file_;
};

TEST_F(UntrustedPluginTest, ATrustedCopyLoads) {
  PluginRegistry registry({dir_});
  EXPECT_EQ(registry.create<Greeter>("gradients", "testgood")->hello(), "hello from testgood");
}

TEST_F(UntrustedPluginTest, WorldWritableDirectoryIsRefusedWithoutLoadingItsFiles) {
  fs::permissions(dir_, fs::perms::all);  // 0777
  PluginRegistry registry({dir_});
  const std::string message = create_error(registry, "gradients", "testgood");
  EXPECT_THAT(message, HasSubstr(dir_ + " is world-writable (mode 0777)"));
  EXPECT_THAT(message, HasSubstr("KOLOS_ALLOW_INSECURE_PLUGINS=1"));
  EXPECT_FALSE(is_loaded(file_));
}

TEST_F(UntrustedPluginTest, WorldWritableFileIsRefused) {
  fs::permissions(file_, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read |
                             fs::perms::others_write);
  PluginRegistry registry({dir_});
  const auto infos = scan_by_file(registry);
  ASSERT_EQ(infos.count("libkolos_testgood.so"), 1u);
  const PluginInfo& info = infos.at("libkolos_testgood.so");
  EXPECT_FALSE(info.usable);
  EXPECT_THAT(info.refusal, HasSubstr(file_ + " is world-writable (mode 0746)"));
  EXPECT_FALSE(is_loaded(file_));
}

TEST_F(UntrustedPluginTest, FileOwnedByAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "changing a file's owner needs root";
  ASSERT_EQ(chown(file_.c_str(), 4242, 4242), 0);
  PluginRegistry registry({dir_});
  EXPECT_THAT(create_error(registry, "gradients", "testgood"),
              HasSubstr(file_ + " is owned by uid 4242, neither root nor this user"));
}

TEST_F(UntrustedPluginTest, OverrideAcceptsAndSaysSo) {
  fs::permissions(dir_, fs::perms::all);
  setenv("KOLOS_ALLOW_INSECURE_PLUGINS", "1", 1);
  PluginRegistry registry({dir_});
  testing::internal::CaptureStderr();
  const std::string hello = registry.create<Greeter>("gradients", "testgood")->hello();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(hello, "hello from testgood");
  EXPECT_THAT(err, HasSubstr("warning: " + dir_ + " is world-writable (mode 0777)"));
  EXPECT_THAT(err, HasSubstr("accepted because KOLOS_ALLOW_INSECURE_PLUGINS=1"));
}

TEST_F(PluginRegistryTest, SearchOrderIsConfigThenEnvironmentThenInstallThenBuild) {
  setenv("KOLOS_PLUGIN_PATH", kShadowDir.c_str(), 1);
  PluginRegistry registry({kGoodDir});
  const std::vector<std::string>& path = registry.search_path();
  ASSERT_GE(path.size(), 3u);
  EXPECT_EQ(path[0], kGoodDir);
  EXPECT_EQ(path[1], kShadowDir);
  // The install's plugin directory, relative to this executable
  // (<prefix>/bin/x -> <prefix>/lib/kolos/plugins), then the build tree's.
  // In the build tree the two are the same directory, so it appears once.
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  const std::string install_dir =
      (exe.parent_path().parent_path() / KOLOS_PLUGIN_INSTALL_SUBDIR).lexically_normal().string();
  EXPECT_EQ(path[2], install_dir);
  EXPECT_NE(std::find(path.begin(), path.end(), KOLOS_PLUGIN_BUILD_DIR), path.end());

  // The first usable plugin of a name wins; the later one is shown shadowed.
  EXPECT_EQ(registry.create<Greeter>("gradients", "testgood")->hello(), "hello from testgood");
  bool saw_shadowed = false;
  for (const PluginInfo& info : registry.scan()) {
    if (info.path == kShadowDir + "/libkolos_testgood.so") {
      saw_shadowed = true;
      EXPECT_FALSE(info.usable);
      EXPECT_EQ(info.refusal, "shadowed by " + good_plugin() +
                                  ", a plugin named `testgood` earlier in the search path");
    }
  }
  EXPECT_TRUE(saw_shadowed);

  PluginRegistry reversed({kShadowDir, kGoodDir});
  EXPECT_EQ(reversed.create<Greeter>("gradients", "testgood")->hello(), "hello from the shadow");
}

TEST_F(PluginRegistryTest, RefusedPluginDoesNotShadowALaterUsableOne) {
  // plugins_bad has a testoldkolos built for another kolos, plugins_shadow a
  // usable one (whose create() returns NULL): the usable one is chosen.
  PluginRegistry registry({kBadDir, kShadowDir});
  const std::string message = create_error(registry, "gradients", "testoldkolos");
  EXPECT_THAT(message, HasSubstr("plugin `testoldkolos` (" + kShadowDir +
                                 "/libkolos_testoldkolos.so) failed to create its object"));
}

TEST_F(PluginRegistryTest, DuplicateDirectoriesAppearOnce) {
  PluginRegistry registry({kGoodDir, kGoodDir + "/", kGoodDir + "/../plugins_good", kGoodDir});
  const std::vector<std::string>& path = registry.search_path();
  EXPECT_EQ(std::count(path.begin(), path.end(), kGoodDir), 1);
  EXPECT_EQ(path[0], kGoodDir);
  EXPECT_NE(path[1], kGoodDir + "/../plugins_good");
  EXPECT_EQ(scan_by_file(registry).count("libkolos_testgood.so"), 1u);
}

TEST_F(PluginRegistryTest, CreatesFromSeveralThreadsAtOnce) {
  PluginRegistry registry({kGoodDir, kBadDir});
  std::atomic<int> greetings{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        if (registry.create<Greeter>("gradients", "testgood")->hello() == "hello from testgood") {
          ++greetings;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(greetings.load(), 40);
}

// KOLOS_DEFINE_PLUGIN stamps the file with this build's versions, in the
// section the registry reads before loading a plugin.
TEST(PluginStamp, DefinePluginStampsTheFile) {
  std::ifstream in(good_plugin(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find(KOLOS_PLUGIN_STAMP_SECTION), std::string::npos);
  EXPECT_NE(bytes.find("kolos=" KOLOS_VERSION " torch=" KOLOS_TORCH_VERSION), std::string::npos);
}

// ---- check_descriptor -------------------------------------------------------

void* create_nothing(char*, size_t) { return nullptr; }
void destroy_nothing(void*) {}

kolos_plugin_descriptor valid_descriptor() {
  return {KOLOS_PLUGIN_ABI_VERSION, "dp",           "gradients",   KOLOS_VERSION,
          KOLOS_TORCH_VERSION,      KOLOS_COMPILER, "description", &create_nothing,
          &destroy_nothing};
}

TEST(CheckDescriptor, AcceptsAMatchingDescriptor) {
  EXPECT_EQ(PluginRegistry::check_descriptor(valid_descriptor()), "");
  for (const std::string& role : role_names()) {
    kolos_plugin_descriptor d = valid_descriptor();
    d.role = role.c_str();
    EXPECT_EQ(PluginRegistry::check_descriptor(d), "") << role;
  }
}

TEST(CheckDescriptor, NamesBothSidesOfAVersionMismatch) {
  kolos_plugin_descriptor d = valid_descriptor();
  d.abi_version = 7;
  d.name = nullptr;  // never read past a foreign ABI version
  EXPECT_THAT(PluginRegistry::check_descriptor(d),
              HasSubstr("built for plugin ABI version 7, this kolos reads plugin ABI version 1"));
  d = valid_descriptor();
  d.kolos_version = "0.0.9";
  EXPECT_EQ(PluginRegistry::check_descriptor(d),
            "built for kolos 0.0.9, this is kolos " KOLOS_VERSION);
  d = valid_descriptor();
  d.torch_version = "2.3.0";
  EXPECT_EQ(PluginRegistry::check_descriptor(d),
            "built for LibTorch 2.3.0, this kolos uses LibTorch " KOLOS_TORCH_VERSION);
}

TEST(CheckDescriptor, RefusesMissingFieldsEmptyNameAndUnknownRole) {
  kolos_plugin_descriptor d = valid_descriptor();
  d.create = nullptr;
  EXPECT_EQ(PluginRegistry::check_descriptor(d), "descriptor field `create` is NULL");
  d = valid_descriptor();
  d.role = nullptr;
  EXPECT_EQ(PluginRegistry::check_descriptor(d), "descriptor field `role` is NULL");
  d = valid_descriptor();
  d.name = "";
  EXPECT_EQ(PluginRegistry::check_descriptor(d), "descriptor has an empty name");
  d = valid_descriptor();
  d.role = "optimizer";
  EXPECT_THAT(PluginRegistry::check_descriptor(d), HasSubstr("unknown role `optimizer` (roles: "));
  d.role = "layer";
  EXPECT_THAT(PluginRegistry::check_descriptor(d), HasSubstr("did you mean `layers`?"));
}

// ---- format_plugin_table ----------------------------------------------------

TEST(FormatPluginTable, ListsUsableAndRefusedPlugins) {
  PluginInfo dp;
  dp.path = "/opt/kolos/lib/kolos/plugins/libkolos_dp.so";
  dp.name = "dp";
  dp.role = "gradients";
  dp.kolos_version = "0.1.0";
  dp.torch_version = "1.13.0";
  dp.description = "data parallel: all-reduce gradients";
  dp.usable = true;
  PluginInfo junk;
  junk.path = "/opt/kolos/lib/kolos/plugins/libkolos_junk.so";
  junk.refusal = "cannot load: invalid ELF header";

  const std::string expected =
      "NAME  ROLE       KOLOS  LIBTORCH  PATH\n"
      "dp    gradients  0.1.0  1.13.0    /opt/kolos/lib/kolos/plugins/libkolos_dp.so\n"
      "    data parallel: all-reduce gradients\n"
      "-     -          -      -         /opt/kolos/lib/kolos/plugins/libkolos_junk.so\n"
      "    refused: cannot load: invalid ELF header\n"
      "1 usable, 1 refused\n";
  EXPECT_EQ(format_plugin_table({dp, junk}), expected);
}

TEST(FormatPluginTable, SaysWhenNothingWasFound) {
  EXPECT_EQ(format_plugin_table({}), "no plugins found\n");
}

TEST_F(PluginRegistryTest, FormatsARealScan) {
  PluginRegistry registry({kGoodDir, kBadDir});
  const std::string table = format_plugin_table(registry.scan());
  const std::size_t row = table.find("\ntestgood ");
  ASSERT_NE(row, std::string::npos) << table;
  const std::string line = table.substr(row + 1, table.find('\n', row + 1) - row - 1);
  EXPECT_THAT(line, ::testing::MatchesRegex("testgood +gradients +" KOLOS_VERSION
                                            " +" KOLOS_TORCH_VERSION " +.*libkolos_testgood.so"));
  EXPECT_THAT(table, HasSubstr("\n    test plugin: says hello from testgood\n"));
  EXPECT_THAT(table,
              HasSubstr("\n    refused: built for kolos 0.0.9, this is kolos " KOLOS_VERSION));
  EXPECT_THAT(table, HasSubstr("\n    refused: descriptor has an empty name\n"));
}

}  // namespace
}  // namespace kolos
