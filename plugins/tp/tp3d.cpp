// The tp3d plugin: GridFactory (tp_grid.h) in mode 3d.
#include "kolos/core/plugin_registry.h"
#include "tp_grid.h"

namespace kolos::tp {
class Tp3d final : public GridFactory {
 public:
  Tp3d() : GridFactory(GridMode::k3d) {}
};
}  // namespace kolos::tp

KOLOS_DEFINE_PLUGIN("tp3d", "layers", kolos::LayerFactory, kolos::tp::Tp3d,
                    "3D tensor parallelism on a q x q x q grid")
