// A plugin whose object cannot be made: its constructor throws, and the
// message must reach the caller through the C boundary.
#include <stdexcept>

#include "greeter.h"
#include "kolos/core/plugin_registry.h"

namespace {

class RefusingGreeter final : public kolos_test::Greeter {
 public:
  RefusingGreeter() { throw std::runtime_error("greeter construction failed on purpose"); }
  std::string hello() const override { return ""; }
  void report_destruction_to(bool*) override {}
};

}  // namespace

KOLOS_DEFINE_PLUGIN("testthrows", "gradients", kolos_test::Greeter, RefusingGreeter,
                    "test plugin: create() always fails")
