// The zero1 plugin: BucketedZero (bucketed_zero.h) at stage 1.
#include "bucketed_zero.h"
#include "kolos/core/plugin_registry.h"

namespace kolos::zero {
class Zero1 final : public BucketedZero {
 public:
  Zero1() : BucketedZero(1) {}
};
}  // namespace kolos::zero

KOLOS_DEFINE_PLUGIN("zero1", "gradients", kolos::GradientStrategy, kolos::zero::Zero1,
                    "ZeRO-1: optimizer states sharded over dp x sp; gradients all-reduced")
