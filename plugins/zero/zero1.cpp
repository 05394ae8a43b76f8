// The zero1 plugin: BucketedZero (bucketed_zero.h) at stage 1.
#include "bucketed_zero.h"
#include "kolos/core/plugin_registry.h"

KOLOS_DEFINE_PLUGIN_OF("zero1", "gradients", kolos::GradientStrategy, kolos::zero::BucketedZero,
                       (1), "ZeRO-1: optimizer states sharded over dp x sp; gradients all-reduced")
