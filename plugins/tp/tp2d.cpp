// The tp2d plugin: GridFactory (tp_grid.h) in mode 2d.
#include "kolos/core/plugin_registry.h"
#include "tp_grid.h"

KOLOS_DEFINE_PLUGIN_OF("tp2d", "layers", kolos::LayerFactory, kolos::tp::GridFactory,
                       (kolos::tp::GridMode::k2d),
                       "2D (SUMMA/Optimus) tensor parallelism on a q x q grid")
