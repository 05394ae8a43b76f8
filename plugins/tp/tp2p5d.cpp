// The tp2p5d plugin: GridFactory (tp_grid.h) in mode 2p5d.
#include "kolos/core/plugin_registry.h"
#include "tp_grid.h"

namespace kolos::tp {
class Tp2p5d final : public GridFactory {
 public:
  Tp2p5d() : GridFactory(GridMode::k2p5d) {}
};
}  // namespace kolos::tp

KOLOS_DEFINE_PLUGIN("tp2p5d", "layers", kolos::LayerFactory, kolos::tp::Tp2p5d,
                    "2.5D (Tesseract) tensor parallelism on a depth x q x q grid")
