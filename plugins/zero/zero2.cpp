// The zero2 plugin: BucketedZero (bucketed_zero.h) at stage 2.
#include "bucketed_zero.h"
#include "kolos/core/plugin_registry.h"

namespace kolos::zero {
class Zero2 final : public BucketedZero {
 public:
  Zero2() : BucketedZero(2) {}
};
}  // namespace kolos::zero

KOLOS_DEFINE_PLUGIN("zero2", "gradients", kolos::GradientStrategy, kolos::zero::Zero2,
                    "ZeRO-2: optimizer states and gradients sharded; bucketed reduce-scatter "
                    "overlapped with backward")
