// The zero3 plugin: BlockwiseZero (blockwise_zero.h).
#include "blockwise_zero.h"
#include "kolos/core/plugin_registry.h"

namespace kolos::zero {
class Zero3 final : public BlockwiseZero {};
}  // namespace kolos::zero

KOLOS_DEFINE_PLUGIN(
    "zero3", "gradients", kolos::GradientStrategy, kolos::zero::Zero3,
    "ZeRO-3: parameters, gradients and optimizer states sharded; per-block gather with prefetch")
