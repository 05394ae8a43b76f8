// The training heap's set-up (kolos/core/malloc_tuning.h): what a training
// process started from an environment runs with. That a real rank restarts
// with the tunables, and what they change, is e2e_memory_heap's.
#include "kolos/core/malloc_tuning.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "kolos/core/error.h"

namespace kolos {
namespace {

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(MallocTuning, SystemKeepsGlibcsDefaults) {
  ScopedEnv choice("KOLOS_MALLOC", "system"), tunables("GLIBC_TUNABLES", std::nullopt);
  const MallocSetup setup = training_malloc();
  EXPECT_FALSE(setup.tuned);
  EXPECT_EQ(setup.reason, "KOLOS_MALLOC=system");
  EXPECT_FALSE(malloc_tuned_here());
}

TEST(MallocTuning, TheDefaultIsGlibcsDefaults) {
  // Unset: glibc's defaults, with no reason to print, and no restart.
  ScopedEnv choice("KOLOS_MALLOC", std::nullopt), tunables("GLIBC_TUNABLES", std::nullopt);
  ScopedEnv marker("KOLOS_MALLOC_REEXEC", std::nullopt);
  const MallocSetup setup = training_malloc();
  EXPECT_FALSE(setup.tuned);
  EXPECT_EQ(setup.reason, "");
  char name[] = "malloc_tuning_test";
  char* argv[] = {name, nullptr};
  reexec_with_malloc_tuning(argv);  // returns: nothing to do
  EXPECT_EQ(std::getenv("GLIBC_TUNABLES"), nullptr);
  EXPECT_EQ(std::getenv("KOLOS_MALLOC_REEXEC"), nullptr);
}

TEST(MallocTuning, AnUnknownChoiceIsRefusedByName) {
  ScopedEnv choice("KOLOS_MALLOC", "jemalloc");
  try {
    training_malloc();
    FAIL() << "KOLOS_MALLOC=jemalloc was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("KOLOS_MALLOC=jemalloc"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("`system`"), std::string::npos) << e.what();
  }
}

TEST(MallocTuning, ARestartedProcessIsTuned) {
  ScopedEnv choice("KOLOS_MALLOC", "tuned");
  ScopedEnv tunables("GLIBC_TUNABLES", std::string("glibc.rtld.nns=2:") + kMallocTunables);
  EXPECT_TRUE(malloc_tuned_here());
  EXPECT_TRUE(training_malloc().tuned);
  // The same tunables set by the user, KOLOS_MALLOC unset: what it runs with.
  ScopedEnv unset("KOLOS_MALLOC", std::nullopt);
  EXPECT_TRUE(training_malloc().tuned);
  // The user's KOLOS_MALLOC=system still wins for the estimate and the log.
  ScopedEnv system("KOLOS_MALLOC", "system");
  EXPECT_FALSE(training_malloc().tuned);
}

TEST(MallocTuning, TheUsersOwnMallocTunablesStand) {
  ScopedEnv choice("KOLOS_MALLOC", "tuned");
  for (const char* own :
       {"glibc.malloc.mmap_threshold=65536", "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2",
        // a longer number is not kolos's threshold
        "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=1310720"}) {
    ScopedEnv tunables("GLIBC_TUNABLES", std::string(own));
    EXPECT_FALSE(malloc_tuned_here()) << own;
    const MallocSetup setup = training_malloc();
    EXPECT_FALSE(setup.tuned) << own;
    EXPECT_EQ(setup.reason, "GLIBC_TUNABLES sets malloc itself") << own;
  }
}

TEST(MallocTuning, OneRestartAtMost) {
  // A restarted process whose GLIBC_TUNABLES did not come through is not
  // counted as tuned, and does not restart again (this call returns).
  ScopedEnv choice("KOLOS_MALLOC", "tuned"), tunables("GLIBC_TUNABLES", std::nullopt);
  ScopedEnv marker("KOLOS_MALLOC_REEXEC", "1");
  const MallocSetup setup = training_malloc();
  EXPECT_FALSE(setup.tuned);
  EXPECT_EQ(setup.reason, "GLIBC_TUNABLES did not reach the restarted process");
  char name[] = "malloc_tuning_test";
  char* argv[] = {name, nullptr};
  reexec_with_malloc_tuning(argv);
  EXPECT_EQ(std::getenv("GLIBC_TUNABLES"), nullptr);
}

}  // namespace
}  // namespace kolos
