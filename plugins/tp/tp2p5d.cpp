// The tp2p5d plugin: GridFactory (tp_grid.h) in mode 2p5d.
#include "kolos/core/plugin_registry.h"
#include "tp_grid.h"

KOLOS_DEFINE_PLUGIN_OF("tp2p5d", "layers", kolos::LayerFactory, kolos::tp::GridFactory,
                       (kolos::tp::GridMode::k2p5d),
                       "2.5D (Tesseract) tensor parallelism on a depth x q x q grid")
