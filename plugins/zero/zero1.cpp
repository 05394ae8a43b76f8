// The zero1 plugin: ZeroStrategy (zero.h) at stage 1.
#include "kolos/core/plugin.h"
#include "zero.h"

namespace kolos::zero {
class Zero1 final : public ZeroStrategy {
 public:
  Zero1() : ZeroStrategy(1) {}
};
}  // namespace kolos::zero

KOLOS_DEFINE_PLUGIN("zero1", "gradients", kolos::GradientStrategy, kolos::zero::Zero1,
                    "ZeRO-1: optimizer states sharded over dp x sp; gradients all-reduced")
