// The tp2d plugin: GridFactory (tp_grid.h) in mode 2d.
#include "kolos/core/plugin_registry.h"
#include "tp_grid.h"

namespace kolos::tp {
class Tp2d final : public GridFactory {
 public:
  Tp2d() : GridFactory(GridMode::k2d) {}
};
}  // namespace kolos::tp

KOLOS_DEFINE_PLUGIN("tp2d", "layers", kolos::LayerFactory, kolos::tp::Tp2d,
                    "2D (SUMMA/Optimus) tensor parallelism on a q x q grid")
