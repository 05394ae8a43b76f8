// The mesh a run's [parallel] sizes make on a given number of ranks
// (resolve_mesh_shape, kolos/core/run_config.h): data derived from the
// world size or checked against it, and the expert axis taken from the data
// ranks; a mesh that does not fit names the sizes and what would.
#include <string>
#include <utility>

#include "kolos/core/error.h"
#include "kolos/core/mesh_layout.h"
#include "kolos/core/run_config.h"
#include "kolos/core/sequence_modes.h"

namespace kolos {

namespace {

// parallel.expert.size ranks of the data ranks form the ep axis; dp keeps
// the rest.
MeshShape split_data_over_experts(MeshShape mesh, const ParallelConfig& p,
                                  const std::string& where) {
  const int64_t ep = p.expert.size;
  if (ep <= 1) return mesh;
  if (mesh.dp % ep != 0) {
    throw ConfigError(where + ": parallel.expert.size = " + std::to_string(ep) +
                      " does not divide the " + std::to_string(mesh.dp) +
                      " data ranks (parallel.data" + (p.data == 0 ? ", derived from the world size" : "") +
                      "): the expert axis splits them; use a size that divides " +
                      std::to_string(mesh.dp) + ", or more data ranks.");
  }
  mesh.dp /= ep;
  mesh.set(expert_axis(), ep);
  return mesh;
}

}  // namespace

MeshShape resolve_mesh_shape(const RunConfig& config, int64_t world_size) {
  const ParallelConfig& p = config.parallel;
  const std::string where = config.source.empty() ? "<config>" : config.source;
  if (world_size < 1) {
    throw ConfigError(where + ": the world size must be >= 1, found " + std::to_string(world_size));
  }
  const std::pair<const char*, int64_t> sizes[] = {{"parallel.pipeline.size", p.pipeline.size},
                                                   {"parallel.sequence.size", p.sequence.size},
                                                   {"parallel.tensor.size", p.tensor.size}};
  for (const auto& [key, size] : sizes) {
    if (size < 1) {
      throw ConfigError(where + ": " + key + " = " + std::to_string(size) + " must be >= 1.");
    }
  }
  if (p.data < 0) {
    throw ConfigError(where + ": parallel.data = " + std::to_string(p.data) +
                      " must be >= 0 (0 derives it from the world size).");
  }
  MeshShape mesh;
  mesh.pp = p.pipeline.size;
  mesh.sp = sequence_axis_size(p.sequence);
  mesh.tp = p.tensor.size;
  int64_t others = 0;
  if (__builtin_mul_overflow(mesh.pp, mesh.sp, &others) ||
      __builtin_mul_overflow(others, mesh.tp, &others)) {
    throw ConfigError(where + ": the mesh does not fit " + std::to_string(world_size) +
                      (world_size == 1 ? " rank" : " ranks") + ": pipeline " +
                      std::to_string(mesh.pp) + " x sequence " + std::to_string(mesh.sp) +
                      " x tensor " + std::to_string(mesh.tp) +
                      " is more than 2^63 ranks; use smaller sizes.");
  }
  const std::string axes = "pipeline " + std::to_string(mesh.pp) + " x sequence " +
                           std::to_string(mesh.sp) + " x tensor " + std::to_string(mesh.tp);
  const std::string world = std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks");
  if (p.data == 0) {
    if (world_size % others != 0) {
      const int64_t below = world_size / others * others;
      std::string launch = below > 0 ? std::to_string(below) + " or " : "";
      launch += std::to_string(below + others);
      throw ConfigError(
          where + ": the mesh does not fit " + world + ": " + axes + " = " +
          std::to_string(others) + " does not divide the world size " + std::to_string(world_size) +
          " (parallel.data = 0 derives data from it); "
          "launch a multiple of " +
          std::to_string(others) + " ranks (e.g. " + launch +
          "), or choose sizes whose product divides " + std::to_string(world_size) + ".");
    }
    mesh.dp = world_size / others;
    return split_data_over_experts(mesh, p, where);
  }
  mesh.dp = p.data;
  int64_t total = 0;
  const bool overflow = __builtin_mul_overflow(others, mesh.dp, &total);
  const std::string total_text = overflow ? "more than 2^63" : std::to_string(total);
  if (overflow || total != world_size) {
    std::string fix;
    if (world_size % others == 0) {
      fix = "set parallel.data = " + std::to_string(world_size / others) +
            " (or 0 to derive it), or launch " + total_text + " ranks";
    } else {
      fix = "launch " + total_text +
            " ranks, or change the sizes so that "
            "their product divides " +
            std::to_string(world_size);
    }
    throw ConfigError(where + ": the mesh does not fit " + world + ": pipeline " +
                      std::to_string(mesh.pp) + " x data " + std::to_string(mesh.dp) +
                      " x sequence " + std::to_string(mesh.sp) + " x tensor " +
                      std::to_string(mesh.tp) + " = " + total_text +
                      ", but the world size is " + std::to_string(world_size) + "; " + fix + ".");
  }
  return split_data_over_experts(mesh, p, where);
}

}  // namespace kolos
