// The zero3 plugin: ZeroStrategy (zero.h) at stage 3.
#include "kolos/core/plugin.h"
#include "zero.h"

namespace kolos::zero {
class Zero3 final : public ZeroStrategy {
 public:
  Zero3() : ZeroStrategy(3) {}
};
}  // namespace kolos::zero

KOLOS_DEFINE_PLUGIN("zero3", "gradients", kolos::GradientStrategy, kolos::zero::Zero3,
                    "ZeRO-3: parameters, gradients and optimizer states sharded; per-block gather with prefetch")
