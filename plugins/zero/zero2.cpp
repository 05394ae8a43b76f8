// The zero2 plugin: BucketedZero (bucketed_zero.h) at stage 2.
#include "bucketed_zero.h"
#include "kolos/core/plugin_registry.h"

KOLOS_DEFINE_PLUGIN_OF("zero2", "gradients", kolos::GradientStrategy, kolos::zero::BucketedZero,
                       (2),
                       "ZeRO-2: optimizer states and gradients sharded; bucketed reduce-scatter "
                       "overlapped with backward")
