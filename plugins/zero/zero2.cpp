// The zero2 plugin: ZeroStrategy (zero.h) at stage 2.
#include "kolos/core/plugin.h"
#include "zero.h"

namespace kolos::zero {
class Zero2 final : public ZeroStrategy {
 public:
  Zero2() : ZeroStrategy(2) {}
};
}  // namespace kolos::zero

KOLOS_DEFINE_PLUGIN("zero2", "gradients", kolos::GradientStrategy, kolos::zero::Zero2,
                    "ZeRO-2: optimizer states and gradients sharded; bucketed reduce-scatter overlapped with backward")
