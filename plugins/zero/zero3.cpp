// The zero3 plugin: BlockwiseZero (blockwise_zero.h).
#include "blockwise_zero.h"
#include "kolos/core/plugin_registry.h"

#ifdef KOLOS_FAULT_INJECTION
#include <cstdlib>
#include <string>

#include "kolos/core/error.h"
#include "kolos/core/mesh.h"
#endif

namespace kolos::zero {
class Zero3 final : public BlockwiseZero {
#ifdef KOLOS_FAULT_INJECTION
 public:
  // The test copy only (libkolos_zero3_faults, never installed):
  // KOLOS_ZERO3_FAIL_SETUP_RANK=R makes set-up fail on world rank R alone,
  // as a rank-local error would (tests/e2e/cli: setup_failure_one_rank).
  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override {
    const char* rank = std::getenv("KOLOS_ZERO3_FAIL_SETUP_RANK");
    if (rank != nullptr && std::to_string(mesh.rank()) == rank) {
      throw Error("zero3: set-up failed on this rank only (injected by KOLOS_ZERO3_FAIL_SETUP_RANK)");
    }
    BlockwiseZero::setup(model, mesh, config);
  }
#endif
};
}  // namespace kolos::zero

KOLOS_DEFINE_PLUGIN(
    "zero3", "gradients", kolos::GradientStrategy, kolos::zero::Zero3,
    "ZeRO-3: parameters, gradients and optimizer states sharded; per-block gather with prefetch")
