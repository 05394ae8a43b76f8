// Placement: where this rank's piece sits in a global tensor.
//
// Every parameter, gradient and optimizer state a rank holds carries one.
// Per dimension it names the slice [offset, offset + length) of the global
// tensor that the local tensor holds; the local tensor may be longer than
// the slice along a dimension (`padded` > length) when a shard was padded to
// an even size (the FSDP2 way: chunk = ceil(n / parts), the last shards
// padded with zeros, so that every piece is a plain hyperslab). `sharded`
// names the mesh axes along which ranks hold different pieces; ranks that
// differ only along the other axes of the mesh hold the same piece
// (replicas). Of the ranks that hold the same piece one, the canonical
// replica, speaks for all of them: checkpoints write each piece once, from
// that rank, as a hyperslab, and the global gradient norm counts it there.
//
// The Placement class is plain arithmetic (no LibTorch); gather_global()
// below is the one collective over pieces.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/mesh.h"

namespace kolos {

struct DimSlice {
  int64_t offset = 0;  // into the global dimension
  int64_t length = 0;  // real elements held (<= padded)
  int64_t padded = 0;  // local extent along this dimension
  bool operator==(const DimSlice& o) const {
    return offset == o.offset && length == o.length && padded == o.padded;
  }
};

class Placement {
 public:
  Placement() = default;
  // The whole tensor on every rank: replicated along every mesh axis.
  static Placement replicated(std::vector<int64_t> global_shape);

  // This placement narrowed along `dim`: the piece is cut into `parts`
  // chunks of ceil(extent/parts) (the last ones padded or empty) and this
  // rank keeps chunk `index`; `axes` become sharded. Composable: tensor
  // parallelism shards first, ZeRO shards the result again.
  Placement shard(int dim, int64_t index, int64_t parts, AxisSet axes) const;
  // As shard(), but even split required (no padding): extent % parts == 0.
  Placement split(int dim, int64_t index, int64_t parts, AxisSet axes) const;

  const std::vector<int64_t>& global_shape() const { return global_shape_; }
  const std::vector<DimSlice>& slices() const { return slices_; }
  const DimSlice& slice(int dim) const { return slices_.at(dim); }
  AxisSet sharded() const { return sharded_; }
  int dim() const { return static_cast<int>(global_shape_.size()); }

  std::vector<int64_t> local_shape() const;   // padded extents: the local tensor's shape
  std::vector<int64_t> piece_shape() const;   // real extents (without padding)
  int64_t global_numel() const;
  int64_t local_numel() const;
  int64_t piece_numel() const;
  bool is_full() const;     // holds the whole global tensor
  bool has_padding() const;
  // True when this piece and `other` overlap; `out` gets the overlap in
  // global coordinates (offset, length per dim).
  bool intersect(const Placement& other, std::vector<DimSlice>* out) const;

  // Whether the rank at `coords` is the canonical replica of its piece: its
  // coordinate is 0 on every axis in `among` that this placement is not
  // sharded along. Ranks that differ only along such axes hold the same
  // piece, and exactly one of them is canonical. `among` defaults to every
  // axis (the checkpoint writer's rule); the gradient norm asks only about
  // the axes along which ranks may hold different parameters (pp).
  bool is_canonical_replica(const Coords& coords, AxisSet among = AxisSet::all()) const;

  std::string to_string() const;  // "[768, 3072] rows 0:384 of 768 | sharded tp"
  bool operator==(const Placement& o) const;

 private:
  std::vector<int64_t> global_shape_;
  std::vector<DimSlice> slices_;
  AxisSet sharded_;
};

// "[768, 3072]"
std::string shape_string(const std::vector<int64_t>& shape);

// The global tensor of a local piece (collective over the placement's
// sharded axes; a copy of the piece when it is the whole tensor). Padding is
// dropped; every rank of the group gets the whole tensor.
at::Tensor gather_global(const at::Tensor& local, const Placement& placement,
                         const DeviceMesh& mesh);
// The same over `axes` only, a subset of the sharded axes whose other
// pieces this rank's group holds (a pipeline stage gathers its parameters
// over the axes besides pp).
at::Tensor gather_global(const at::Tensor& local, const Placement& placement,
                         const DeviceMesh& mesh, AxisSet axes);

}  // namespace kolos
