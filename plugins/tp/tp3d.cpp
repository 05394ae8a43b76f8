// The tp3d plugin: GridFactory (tp_grid.h) in mode 3d.
#include "kolos/core/plugin_registry.h"
#include "tp_grid.h"

KOLOS_DEFINE_PLUGIN_OF("tp3d", "layers", kolos::LayerFactory, kolos::tp::GridFactory,
                       (kolos::tp::GridMode::k3d), "3D tensor parallelism on a q x q x q grid")
