// The readers of a checkpoint (reader.h): the index, each piece's source in
// its shard, the directories. Every size taken from a file is bounded before
// anything is allocated (h5::extents, the limits in reader.h).
#include "reader.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "crc32c.h"
#include "h5.h"

namespace fs = std::filesystem;

namespace kolos::checkpoint {
namespace detail {

using h5::H5Id;

namespace {
std::string slash(const std::string& path) { return "/" + path; }
}  // namespace

std::string list_string(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t d = 0; d < dims.size(); ++d) out += (d ? ", " : "") + std::to_string(dims[d]);
  return out + "]";
}

IndexInfo read_index(const std::string& dir, bool with_rng) {
  auto lock = h5::h5_lock();
  IndexInfo info;
  info.dir = dir;
  const std::string path = dir + "/index.h5";
  if (!fs::exists(path)) throw CheckpointError(dir + " is not a checkpoint: no index.h5");
  H5Id file = h5::open_file_read(path);
  const int64_t format = h5::read_attr_int(file, "kolos.format", path);
  if (format != kFormatVersion) {
    throw CheckpointError(path + ": checkpoint format " + std::to_string(format) +
                          ", this kolos reads format " + std::to_string(kFormatVersion));
  }
  Metadata& m = info.meta;
  m.kolos_version = h5::read_attr_string(file, "kolos.version", 256, path);
  // Counts are never negative: a run resumed from step -4 would redo steps
  // and read data before its start.
  const auto count = [&](const char* name) {
    const int64_t v = h5::read_attr_int(file, name, path);
    if (v < 0) {
      throw CheckpointError(path + ": attribute " + name + " is " + std::to_string(v) +
                            "; it counts what the run has done and must be >= 0");
    }
    return v;
  };
  m.step = count("step");
  m.data_position = count("data_position");
  m.optimizer_steps = count("optimizer_steps");
  m.config_toml = h5::read_attr_string(file, "config", kMaxText, path);
  if (h5::has_attr(file, "loss_scale")) {
    const std::string text = h5::read_attr_string(file, "loss_scale", 64, path);
    char* end = nullptr;
    m.loss_scale = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(m.loss_scale > 0) || !std::isfinite(m.loss_scale)) {
      throw CheckpointError(path + ": attribute loss_scale is \"" + text +
                            "\"; it must be a finite number > 0");
    }
    m.loss_scale_good_steps = count("loss_scale_good_steps");
  }
  const auto mesh = h5::read_attr_ints(file, "mesh", kMaxAxes, path);
  // The axes' names: the core's four unless the writer used more.
  std::vector<std::string> names{"pp", "dp", "sp", "tp"};
  if (h5::has_attr(file, "mesh_axes")) {
    names.clear();
    std::istringstream list(h5::read_attr_string(file, "mesh_axes", 256, path));
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
  }
  if (mesh.size() != names.size() || names.size() < 4 || names[0] != "pp" || names[1] != "dp" ||
      names[2] != "sp" || names[3] != "tp") {
    throw CheckpointError(path + ": attribute mesh " + dims_string(mesh) +
                          " does not match its axes (mesh_axes) or lacks pp, dp, sp, tp first");
  }
  int64_t ranks = 1;
  for (const int64_t size : mesh) {
    if (size < 1 || __builtin_mul_overflow(ranks, size, &ranks)) {
      throw CheckpointError(path + ": attribute mesh " + dims_string(mesh) +
                            ": every size must be >= 1 and their product fit 64 bits");
    }
  }
  m.mesh = MeshShape{mesh[0], mesh[1], mesh[2], mesh[3]};
  for (size_t i = 4; i < names.size(); ++i) {
    const std::optional<Axis> axis = find_axis(names[i]);
    if (!axis) {
      throw CheckpointError(path + ": written on a mesh with axis \"" + names[i] + "\" (size " +
                            std::to_string(mesh[i]) +
                            "), which this program does not register; its pieces are "
                            "still readable by any layout once the axis's plugin is loaded");
    }
    m.mesh.set(*axis, mesh[i]);
  }
  m.world_size = h5::read_attr_int(file, "world_size", path);
  if (m.world_size != ranks) {
    throw CheckpointError(path + ": attribute world_size is " + std::to_string(m.world_size) +
                          ", the mesh " + dims_string(mesh) + " (" + list_string(names) + ") has " +
                          std::to_string(ranks) + " ranks");
  }
  info.writers = h5::read_attr_ints(file, "writers", kMaxMappings, path);
  std::istringstream tensors(h5::read_attr_string(file, "tensors", kMaxText, path));
  for (std::string t; std::getline(tensors, t);) {
    if (!t.empty()) info.tensors.push_back(t);
  }
  if (static_cast<int64_t>(info.tensors.size()) > kMaxTensors) {
    throw CheckpointError(path + ": more than " + std::to_string(kMaxTensors) + " tensors");
  }

  if (with_rng && h5::exists(file, "/rng/cpu")) {
    const std::string where = path + ": dataset /rng/cpu";
    H5Id ds = h5::dataset(H5Dopen2(file, "/rng/cpu", H5P_DEFAULT), where);
    const auto dims = h5::extents(ds, kMaxRngBytes, where);
    // One LibTorch CPU generator state per rank of the writing world.
    const std::vector<int64_t> expected = {m.world_size, cpu_rng_state_bytes()};
    if (dims != expected) {
      throw CheckpointError(where + ": shape " + dims_string(dims) + ", expected " +
                            dims_string(expected) + " (one " + std::to_string(expected[1]) +
                            "-byte LibTorch CPU generator state per rank of the writing world)");
    }
    std::vector<uint8_t> flat(static_cast<size_t>(dims[0] * dims[1]));
    if (!flat.empty() &&
        H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat.data()) < 0) {
      h5::fail("cannot read " + where);
    }
    for (int64_t r = 0; r < dims[0]; ++r) {
      m.rng_cpu.emplace_back(flat.begin() + r * dims[1], flat.begin() + (r + 1) * dims[1]);
    }
  }

  for (const auto& tensor : info.tensors) {
    const std::string where = path + ": dataset /" + tensor;
    if (tensor.find('%') != std::string::npos || !h5::exists(file, slash(tensor))) {
      throw CheckpointError(where + " is listed but missing");
    }
    H5Id ds = h5::dataset(H5Dopen2(file, slash(tensor).c_str(), H5P_DEFAULT), where);
    const auto shape = h5::extents(ds, std::numeric_limits<int64_t>::max() / 8, where);
    const std::string dtype = h5::read_attr_string(ds, "kolos.dtype", 32, where);
    if (!h5::known_dtype(dtype)) throw CheckpointError(where + ": unknown dtype " + dtype);
    info.shapes[tensor] = shape;
    info.dtypes[tensor] = dtype;
    H5Id dcpl = h5::plist(H5Dget_create_plist(ds), where);
    if (H5Pget_layout(dcpl) != H5D_VIRTUAL) {
      throw CheckpointError(where + " is not a virtual dataset");
    }
    size_t count = 0;
    if (H5Pget_virtual_count(dcpl, &count) < 0) h5::fail(where + ": mappings");
    if (count > static_cast<size_t>(kMaxMappings)) {
      throw CheckpointError(where + ": " + std::to_string(count) + " pieces, at most " +
                            std::to_string(kMaxMappings) + " accepted");
    }
    for (size_t i = 0; i < count; ++i) {
      Mapping mp;
      mp.tensor = tensor;
      for (int which = 0; which < 2; ++which) {
        const ssize_t n = which == 0 ? H5Pget_virtual_filename(dcpl, i, nullptr, 0)
                                     : H5Pget_virtual_dsetname(dcpl, i, nullptr, 0);
        if (n < 0 || n > kMaxName) throw CheckpointError(where + ": bad source name length");
        std::string s(static_cast<size_t>(n) + 1, '\0');
        if (which == 0) {
          H5Pget_virtual_filename(dcpl, i, s.data(), s.size());
        } else {
          H5Pget_virtual_dsetname(dcpl, i, s.data(), s.size());
        }
        s.resize(static_cast<size_t>(n));
        (which == 0 ? mp.file : mp.dataset) = s;
      }
      H5Id vspace = h5::space(H5Pget_virtual_vspace(dcpl, i), where);
      const int nd = H5Sget_simple_extent_ndims(vspace);
      if (nd != static_cast<int>(shape.size())) {
        throw CheckpointError(where + ": piece " + std::to_string(i) + " has the wrong rank");
      }
      std::vector<hsize_t> start(nd), stride(nd), cnt(nd), block(nd);
      if (H5Sget_regular_hyperslab(vspace, start.data(), stride.data(), cnt.data(), block.data()) <
          0) {
        h5::fail(where + ": piece " + std::to_string(i) + " is not a regular hyperslab");
      }
      for (int d = 0; d < nd; ++d) {
        mp.offset.push_back(static_cast<int64_t>(start[d]));
        mp.length.push_back(static_cast<int64_t>(cnt[d] * block[d]));
      }
      info.mappings.push_back(std::move(mp));
    }
  }
  return info;
}

std::string verify_mapping(const IndexInfo& index, const Mapping& m) {
  auto lock = h5::h5_lock();
  const std::string file = index.dir + "/" + m.file;
  const std::string where = file + ": dataset " + m.dataset;
  try {
    // Source names come from the file: accept only our own shard names.
    const bool ours = m.file.size() > 9 && m.file.rfind("shard-", 0) == 0 &&
                      m.file.compare(m.file.size() - 3, 3, ".h5") == 0 &&
                      m.file.find_first_not_of("0123456789", 6) == m.file.size() - 3;
    if (!ours)
      return index.dir + "/index.h5: " + m.tensor + " maps to `" + m.file + "`, not a shard";
    if (m.dataset != slash(m.tensor)) {
      return index.dir + "/index.h5: " + m.tensor + " maps to dataset " + m.dataset;
    }
    std::error_code ec;
    const auto file_size = fs::file_size(file, ec);
    if (ec) {
      return "missing shard " + file + " (holds dataset " + m.dataset + " " +
             dims_string(m.length) + " at " + dims_string(m.offset) + ")";
    }
    H5Id f = h5::open_file_read(file);
    if (!h5::exists(f, m.dataset)) return where + " is missing";
    H5Id ds = h5::dataset(H5Dopen2(f, m.dataset.c_str(), H5P_DEFAULT), where);
    const std::string dtype = h5::read_attr_string(ds, "kolos.dtype", 32, where);
    const auto it = index.dtypes.find(m.tensor);
    if (it == index.dtypes.end() || dtype != it->second) {
      return where + ": dtype " + dtype + " differs from the index's";
    }
    H5Id dcpl = h5::plist(H5Dget_create_plist(ds), where);
    if (H5Pget_layout(dcpl) != H5D_CONTIGUOUS) return where + " is not contiguous";
    const int64_t esize = h5::element_size(dtype);
    // A contiguous dataset cannot hold more than its file's bytes.
    const auto shape = h5::extents(ds, static_cast<int64_t>(file_size) / esize, where);
    if (shape != m.length) {
      return where + ": shape " + dims_string(shape) + ", the index expects " +
             dims_string(m.length);
    }
    const auto offset = h5::read_attr_ints(ds, "kolos.offset", H5S_MAX_RANK, where);
    if (offset != m.offset) {
      return where + ": offset " + dims_string(offset) + ", the index maps it at " +
             dims_string(m.offset);
    }
    const uint32_t stored = static_cast<uint32_t>(h5::read_attr_int(ds, "kolos.crc32c", where));
    // Checksum in bounded chunks of whole rows (dim 0).
    uint32_t crc = 0;
    h5::read_rows(ds, shape, dtype, kChunkBytes, where,
                  [&](const char* data, size_t bytes) { crc = crc32c(crc, data, bytes); });
    if (crc != stored) {
      char line[128];
      std::snprintf(line, sizeof line, ": checksum mismatch (stored %08x, read %08x)", stored, crc);
      return where + line + ": the file is damaged";
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> coverage_problems(const IndexInfo& index) {
  std::vector<std::string> problems;
  std::map<std::string, int64_t> covered;
  for (const auto& m : index.mappings) {
    // Offsets and lengths come from the file: compare without overflow (a
    // piece inside its tensor has at most the tensor's bounded numel).
    int64_t n = 1;
    bool inside = true;
    const auto& shape = index.shapes.at(m.tensor);
    for (size_t d = 0; d < m.length.size(); ++d) {
      inside = inside && m.offset[d] >= 0 && m.length[d] >= 0 && m.offset[d] <= shape[d] &&
               m.length[d] <= shape[d] - m.offset[d];
      if (inside) n *= m.length[d];
    }
    if (!inside) {
      problems.push_back(index.dir + "/index.h5: " + m.tensor + ": a piece lies outside it");
      continue;
    }
    int64_t& sum = covered[m.tensor];
    if (__builtin_add_overflow(sum, n, &sum)) sum = std::numeric_limits<int64_t>::max();
  }
  for (const auto& t : index.tensors) {
    int64_t n = 1;
    for (auto d : index.shapes.at(t)) n *= d;
    if (covered[t] != n) {
      problems.push_back(index.dir + "/index.h5: dataset /" + t + ": pieces hold " +
                         std::to_string(covered[t]) + " of its " + std::to_string(n) +
                         " elements (incomplete checkpoint)");
    }
  }
  return problems;
}

}  // namespace detail

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

namespace {
// What <root>/latest says: nothing (no file, unreadable, empty), a name, or
// a name that does not stay inside `root` (`outside` set).
struct LatestPointer {
  std::string name;
  bool outside = false;
};

LatestPointer read_latest(const std::string& root) {
  LatestPointer p;
  std::ifstream in(fs::path(root) / "latest");
  if (!in || !std::getline(in, p.name)) return {};
  // Only a directory name of this root: no separator, not . or .., no NUL.
  p.outside = p.name.size() > 256 || p.name.find('/') != std::string::npos ||
              p.name.find('\0') != std::string::npos || p.name == "." || p.name == "..";
  return p;
}
}  // namespace

std::string latest(const std::string& root) {
  const LatestPointer p = read_latest(root);
  if (p.name.empty() || p.outside) return "";
  return (fs::path(root) / p.name).string();
}

std::string resolve(const std::string& path) {
  if (fs::exists(fs::path(path) / "index.h5")) return path;
  const LatestPointer p = read_latest(path);
  if (p.outside) {
    const std::string shown = p.name.size() > 256 ? p.name.substr(0, 256) + "..." : p.name;
    throw CheckpointError(path + "/latest: `" + shown +
                          "` points outside the checkpoint directory " + path +
                          "; it must name a step-N directory inside it");
  }
  if (!p.name.empty()) {
    const std::string l = (fs::path(path) / p.name).string();
    if (!fs::exists(fs::path(l) / "index.h5")) {
      throw CheckpointError(path + "/latest names " + l + ", which holds no index.h5");
    }
    return l;
  }
  if (!fs::exists(path)) throw CheckpointError("no checkpoint at " + path + ": it does not exist");
  throw CheckpointError("no checkpoint at " + path + ": neither an index.h5 nor a `latest` file");
}

std::vector<std::string> verify(const std::string& path) {
  std::vector<std::string> problems;
  detail::IndexInfo index;
  try {
    index = detail::read_index(resolve(path), /*with_rng=*/true);
  } catch (const std::exception& e) {
    return {e.what()};
  }
  for (const auto& w : index.writers) {
    const std::string shard = index.dir + "/shard-" + std::to_string(w) + ".h5";
    if (!fs::exists(shard)) problems.push_back("missing shard " + shard);
  }
  for (auto& p : detail::coverage_problems(index)) problems.push_back(std::move(p));
  for (const auto& m : index.mappings) {
    std::string problem = detail::verify_mapping(index, m);
    if (!problem.empty()) problems.push_back(std::move(problem));
  }
  return problems;
}

}  // namespace kolos::checkpoint
