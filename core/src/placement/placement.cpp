#include "kolos/core/placement.h"

#include <algorithm>
#include <sstream>

#include "kolos/core/error.h"

namespace kolos {

Placement Placement::replicated(std::vector<int64_t> global_shape) {
  Placement p;
  for (int64_t n : global_shape) {
    KOLOS_CHECK(n >= 0, "negative extent ", n, " in a global shape");
    p.slices_.push_back(DimSlice{0, n, n});
  }
  p.global_shape_ = std::move(global_shape);
  return p;
}

Placement Placement::shard(int dim, int64_t index, int64_t parts, AxisSet axes) const {
  KOLOS_CHECK(dim >= 0 && dim < this->dim(), "cannot shard dimension ", dim, " of ", to_string());
  KOLOS_CHECK(parts >= 1 && index >= 0 && index < parts, "shard index ", index, " of ", parts);
  Placement p = *this;
  const DimSlice& s = slices_[dim];
  // Chunks of the local extent (padding included, so that a padded piece,
  // as tensor parallelism leaves it, shards again as its tensor does);
  // real elements are those below `length`.
  int64_t chunk = (s.padded + parts - 1) / parts;
  int64_t begin = std::min(s.length, index * chunk);
  int64_t end = std::min(s.length, index * chunk + chunk);
  p.slices_[dim] = DimSlice{s.offset + begin, std::max<int64_t>(0, end - begin), chunk};
  p.sharded_ = sharded_ | axes;
  return p;
}

Placement Placement::split(int dim, int64_t index, int64_t parts, AxisSet axes) const {
  KOLOS_CHECK(dim >= 0 && dim < this->dim(), "cannot split dimension ", dim, " of ", to_string());
  KOLOS_CHECK(slices_[dim].length % parts == 0, "dimension ", dim, " of extent ",
              slices_[dim].length, " does not divide into ", parts, " equal parts");
  return shard(dim, index, parts, axes);
}

std::vector<int64_t> Placement::local_shape() const {
  std::vector<int64_t> shape;
  for (const auto& s : slices_) shape.push_back(s.padded);
  return shape;
}

std::vector<int64_t> Placement::piece_shape() const {
  std::vector<int64_t> shape;
  for (const auto& s : slices_) shape.push_back(s.length);
  return shape;
}

namespace {
int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}
}  // namespace

int64_t Placement::global_numel() const { return product(global_shape_); }
int64_t Placement::local_numel() const { return product(local_shape()); }
int64_t Placement::piece_numel() const { return product(piece_shape()); }

bool Placement::is_full() const {
  for (size_t d = 0; d < slices_.size(); ++d) {
    if (slices_[d].offset != 0 || slices_[d].length != global_shape_[d]) return false;
  }
  return true;
}

bool Placement::has_padding() const {
  return std::any_of(slices_.begin(), slices_.end(),
                     [](const DimSlice& s) { return s.padded != s.length; });
}

bool Placement::intersect(const Placement& other, std::vector<DimSlice>* out) const {
  KOLOS_CHECK(global_shape_ == other.global_shape_, "intersecting pieces of different tensors: ",
              to_string(), " and ", other.to_string());
  std::vector<DimSlice> overlap;
  for (size_t d = 0; d < slices_.size(); ++d) {
    int64_t begin = std::max(slices_[d].offset, other.slices_[d].offset);
    int64_t end = std::min(slices_[d].offset + slices_[d].length,
                           other.slices_[d].offset + other.slices_[d].length);
    if (end <= begin) return false;
    overlap.push_back(DimSlice{begin, end - begin, end - begin});
  }
  if (out != nullptr) *out = std::move(overlap);
  return true;
}

bool Placement::is_canonical_replica(const Coords& coords, AxisSet among) const {
  for (int a = 0; a < kMaxAxes; ++a) {
    const Axis axis = static_cast<Axis>(a);
    if (among.contains(axis) && !sharded_.contains(axis) && coords[a] != 0) return false;
  }
  return true;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  out << ']';
  return out.str();
}

std::string Placement::to_string() const {
  std::ostringstream out;
  out << shape_string(global_shape_);
  if (is_full()) {
    out << " whole";
  } else {
    out << " piece [";
    for (size_t d = 0; d < slices_.size(); ++d) {
      const auto& s = slices_[d];
      out << (d ? ", " : "") << s.offset << ':' << s.offset + s.length;
      if (s.padded != s.length) out << "+pad" << s.padded - s.length;
    }
    out << ']';
  }
  out << " | sharded " << sharded_.to_string();
  return out.str();
}

bool Placement::operator==(const Placement& o) const {
  return global_shape_ == o.global_shape_ && slices_ == o.slices_ && sharded_ == o.sharded_;
}

}  // namespace kolos
