#include "kolos/core/mesh_layout.h"

#include <algorithm>
#include <mutex>
#include <sstream>

#include "kolos/core/error.h"

namespace kolos {

namespace {

// Entries are never removed and the vector never grows past its reserve, so
// references to them (axis_info, to_string) stay valid.
struct Registry {
  std::mutex mutex;
  std::vector<AxisInfo> axes;
  Registry() {
    axes.reserve(kMaxAxes);
    for (AxisInfo a : {AxisInfo{"pp", 100, false}, AxisInfo{"dp", 200, false, true},
                       AxisInfo{"sp", 300, true}, AxisInfo{"tp", 400, true},
                       AxisInfo{"ep", 250, false, true}}) {
      axes.push_back(std::move(a));
    }
  }
};
Registry& registry() {
  static Registry r;
  return r;
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 16 || name[0] < 'a' || name[0] > 'z') return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

int index_of(Axis axis) { return static_cast<int>(axis); }

}  // namespace

Axis register_axis(const std::string& name, int order, bool within_node, bool splits_batch) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  KOLOS_CHECK(valid_name(name), "mesh axis name \"", name,
              "\": use 1-16 of [a-z0-9_], starting with a letter");
  for (size_t i = 0; i < r.axes.size(); ++i) {
    const AxisInfo& a = r.axes[i];
    if (a.name == name) {
      KOLOS_CHECK(a.order == order && a.within_node == within_node &&
                      a.splits_batch == splits_batch,
                  "mesh axis \"", name, "\" is registered with order ", a.order,
                  a.within_node ? " within a node" : "",
                  a.splits_batch ? " splitting the batch" : "",
                  "; registering it again with order ", order,
                  within_node ? " within a node" : "", splits_batch ? " splitting the batch" : "",
                  " differs");
      return static_cast<Axis>(i);
    }
    KOLOS_CHECK(a.order != order, "mesh axis \"", name, "\": order ", order,
                " is taken by axis \"", a.name, "\"");
  }
  KOLOS_CHECK(static_cast<int>(r.axes.size()) < kMaxAxes, "mesh axis \"", name,
              "\": the mesh holds at most ", kMaxAxes, " axes");
  r.axes.push_back(AxisInfo{name, order, within_node, splits_batch});
  return static_cast<Axis>(r.axes.size() - 1);
}

const AxisInfo& axis_info(Axis axis) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  KOLOS_CHECK(index_of(axis) >= 0 && index_of(axis) < static_cast<int>(r.axes.size()),
              "mesh axis ", index_of(axis), " is not registered");
  return r.axes[index_of(axis)];
}

std::optional<Axis> find_axis(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (size_t i = 0; i < r.axes.size(); ++i) {
    if (r.axes[i].name == name) return static_cast<Axis>(i);
  }
  return std::nullopt;
}

std::vector<Axis> axes_in_order() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<Axis> out;
  for (size_t i = 0; i < r.axes.size(); ++i) out.push_back(static_cast<Axis>(i));
  std::sort(out.begin(), out.end(),
            [&](Axis a, Axis b) { return r.axes[index_of(a)].order < r.axes[index_of(b)].order; });
  return out;
}

const char* to_string(Axis axis) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const int i = index_of(axis);
  return i >= 0 && i < static_cast<int>(r.axes.size()) ? r.axes[i].name.c_str() : "?";
}

Axis expert_axis() {
  static const Axis axis = *find_axis("ep");
  return axis;
}

AxisSet batch_axes() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  AxisSet out;
  for (size_t i = 0; i < r.axes.size(); ++i) {
    if (r.axes[i].splits_batch) out = out | AxisSet{static_cast<Axis>(i)};
  }
  return out;
}

int64_t MeshShape::batch_ranks() const {
  int64_t n = 1;
  for (Axis a : axes_in_order()) {
    if (batch_axes().contains(a)) n *= of(a);
  }
  return n;
}

int64_t MeshShape::of(Axis axis) const {
  switch (axis) {
    case Axis::kPP:
      return pp;
    case Axis::kDP:
      return dp;
    case Axis::kSP:
      return sp;
    case Axis::kTP:
      return tp;
  }
  const int i = index_of(axis) - kCoreAxes;
  return i >= 0 && i < static_cast<int>(registered.size()) ? registered[i] : 1;
}

void MeshShape::set(Axis axis, int64_t size) {
  switch (axis) {
    case Axis::kPP:
      pp = size;
      return;
    case Axis::kDP:
      dp = size;
      return;
    case Axis::kSP:
      sp = size;
      return;
    case Axis::kTP:
      tp = size;
      return;
  }
  const int i = index_of(axis) - kCoreAxes;
  KOLOS_CHECK(i >= 0 && i < static_cast<int>(registered.size()), "mesh axis ", index_of(axis),
              " outside the mesh");
  registered[i] = size;
}

int64_t MeshShape::size() const {
  int64_t n = pp * dp * sp * tp;
  for (int64_t s : registered) n *= s;
  return n;
}

std::string AxisSet::to_string() const {
  if (empty()) return "none";
  const std::vector<Axis> order = axes_in_order();
  bool every = true;
  for (Axis a : order) every = every && contains(a);
  if (every) return "world";
  std::string out;
  for (Axis a : order) {
    if (!contains(a)) continue;
    if (!out.empty()) out += "×";
    out += kolos::to_string(a);
  }
  return out;
}

MeshLayout::MeshLayout(MeshShape shape) : shape_(shape), order_(axes_in_order()) {
  for (Axis a : order_) {
    KOLOS_CHECK_KIND(kConfig, shape.of(a) >= 1, "mesh axis sizes must be >= 1, got ", describe());
  }
  for (int i = static_cast<int>(order_.size()); i < kMaxAxes; ++i) {
    KOLOS_CHECK(shape.of(static_cast<Axis>(i)) == 1, "mesh axis ", i,
                " has size ", shape.of(static_cast<Axis>(i)), " but is not registered");
  }
}

int64_t MeshLayout::size(Axis axis) const { return shape_.of(axis); }

int64_t MeshLayout::size(AxisSet axes) const {
  int64_t n = 1;
  for (Axis a : order_) {
    if (axes.contains(a)) n *= size(a);
  }
  return n;
}

Coords MeshLayout::coords(int64_t rank) const {
  KOLOS_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " outside mesh ", describe());
  Coords c{};
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const int64_t n = size(*it);
    c[index_of(*it)] = rank % n;
    rank /= n;
  }
  return c;
}

int64_t MeshLayout::rank_of(const Coords& c) const {
  int64_t rank = 0;
  for (Axis a : order_) {
    const int64_t n = size(a);
    const int64_t x = c[index_of(a)];
    KOLOS_CHECK(x >= 0 && x < n, "coordinate ", x, " outside axis ", to_string(a), " of size ",
                n);
    rank = rank * n + x;
  }
  return rank;
}

std::vector<int64_t> MeshLayout::group_ranks(int64_t rank, AxisSet axes) const {
  Coords base = coords(rank);
  std::vector<int64_t> ranks;
  ranks.reserve(size(axes));
  // Row-major over the axes in the set (outermost first).
  for (int64_t index = 0; index < size(axes); ++index) {
    Coords c = base;
    int64_t rest = index;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (!axes.contains(*it)) continue;
      const int64_t n = size(*it);
      c[index_of(*it)] = rest % n;
      rest /= n;
    }
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

int64_t MeshLayout::index_in_group(int64_t rank, AxisSet axes) const {
  Coords c = coords(rank);
  int64_t index = 0;
  for (Axis a : order_) {
    if (axes.contains(a)) index = index * size(a) + c[index_of(a)];
  }
  return index;
}

std::string MeshLayout::describe() const {
  std::ostringstream out;
  out << "pp=" << shape_.pp << " dp=" << shape_.dp << " sp=" << shape_.sp << " tp=" << shape_.tp;
  for (Axis a : order_) {
    if (index_of(a) >= kCoreAxes && size(a) > 1) out << ' ' << to_string(a) << '=' << size(a);
  }
  return out.str();
}

}  // namespace kolos
