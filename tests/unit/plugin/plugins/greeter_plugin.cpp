// A well-formed plugin made with KOLOS_DEFINE_PLUGIN. Built twice: "testgood"
// in plugins_good and, with another greeting, in plugins_shadow, to show
// which of two same-named plugins the search order picks.
#include "greeter.h"
#include "kolos/core/error.h"
#include "kolos/core/plugin_registry.h"

namespace {

class TestGreeter final : public kolos_test::Greeter {
 public:
  ~TestGreeter() override {
    if (destroyed_ != nullptr) *destroyed_ = true;
  }
  std::string hello() const override { return KOLOS_TEST_GREETING; }
  void report_destruction_to(bool* flag) override { destroyed_ = flag; }
  void refuse(const std::string& message) const override { throw kolos::ConfigError(message); }

 private:
  bool* destroyed_ = nullptr;
};

}  // namespace

KOLOS_DEFINE_PLUGIN("testgood", "gradients", kolos_test::Greeter, TestGreeter,
                    "test plugin: says " KOLOS_TEST_GREETING)
