// The save and load protocols (see checkpoint.h for the format).
//
// Save, collective over the checkpoint communicator:
//   1. rank 0 creates <root>/.tmp-step-N (removing a leftover one);  agree
//   2. each writing rank writes shard-R.h5 into it and fsyncs it;     agree
//   3. the pieces' records (path, offsets, extents, crc) go to rank 0;
//   4. rank 0 checks that the pieces of every tensor cover it exactly once,
//      writes index.h5 (virtual datasets), fsyncs it and the directory,
//      renames .tmp-step-N to step-N and fsyncs <root>;                agree
// "agree" is detail::agree_on_error: every rank learns the first failure and
// throws the same error. A rank that dies anywhere before step 4's rename
// leaves only the temporary directory behind.
//
// Load, collective:
//   1. every rank reads the index (bounded), checks that this run's tensors
//      and the checkpoint's are the same set with the same global shapes and
//      dtypes, and verifies the sources assigned to it (mapping i is checked
//      by rank i mod size: presence, shape, offset, checksum);      agree
//   2. every rank reads, for each of its pieces, the hyperslab its placement
//      names from the index's virtual dataset into the local tensor.  agree
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "crc32c.h"
#include "h5.h"
#include "kolos/config.h"
#include "kolos/core/dtype_torch.h"
#include "kolos/core/runtime.h"
#include "store_detail.h"

namespace fs = std::filesystem;

namespace kolos::checkpoint {
namespace detail {
namespace {

using h5::H5Id;

void agree(comm::ProcessGroup& group, const std::string& error) {
  kolos::detail::agree_on_error(group, error, static_cast<int>(ErrorKind::kCheckpoint));
}

template <typename Body>
std::string capture(Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string slash(const std::string& path) { return "/" + path; }

void check_path(const std::string& path) {
  if (path.empty() || path.size() > static_cast<size_t>(kMaxName) ||
      path.find_first_of("%\t\n\r") != std::string::npos || path.front() == '/' ||
      path.find("//") != std::string::npos) {
    throw CheckpointError("tensor name `" + path +
                          "` cannot be stored (empty, too long, or holds %, a tab or a newline)");
  }
}

std::string shard_name(int64_t rank) { return "shard-" + std::to_string(rank) + ".h5"; }

// Records travel to rank 0 as text, one per line, tab-separated.
std::string serialize(const std::vector<HostPiece>& pieces) {
  std::ostringstream out;
  for (const auto& p : pieces) {
    const Record& r = p.record;
    out << r.path << '\t' << r.dtype << '\t' << r.rank << '\t' << r.crc << '\t'
        << r.global_shape.size();
    for (auto v : r.global_shape) out << '\t' << v;
    for (auto v : r.offset) out << '\t' << v;
    for (auto v : r.length) out << '\t' << v;
    out << '\n';
  }
  return out.str();
}

std::vector<Record> deserialize(const std::string& text) {
  std::vector<Record> records;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Record r;
    size_t ndim = 0;
    std::getline(fields, r.path, '\t');
    std::getline(fields, r.dtype, '\t');
    fields >> r.rank >> r.crc >> ndim;
    r.global_shape.resize(ndim);
    r.offset.resize(ndim);
    r.length.resize(ndim);
    for (auto& v : r.global_shape) fields >> v;
    for (auto& v : r.offset) fields >> v;
    for (auto& v : r.length) fields >> v;
    records.push_back(std::move(r));
  }
  return records;
}

// Fault injection, compiled only into the test copy of the library
// (libkolos_checkpoint built with KOLOS_FAULT_INJECTION into lib/faults of
// the build tree, never installed): with KOLOS_CKPT_TEST_DIE_RANK=R and
// KOLOS_CKPT_TEST_DIE_STEP=S, rank R _exit()s with code 9 right after
// writing its shard of the save of step S, before the save commits, as a
// rank killed mid-save would.
#ifdef KOLOS_FAULT_INJECTION
void maybe_die(int rank, int64_t step) {
  const char* die_rank = std::getenv("KOLOS_CKPT_TEST_DIE_RANK");
  const char* die_step = std::getenv("KOLOS_CKPT_TEST_DIE_STEP");
  if (die_rank && die_step && std::atoi(die_rank) == rank && std::atoll(die_step) == step) {
    std::fprintf(stderr, "kolos: test hook: rank %d dies in the middle of saving step %lld\n",
                 rank, static_cast<long long>(step));
    std::fflush(stderr);
    _exit(9);
  }
}
#else
void maybe_die(int, int64_t) {}
#endif

void write_shard(const std::string& path, int rank, const std::vector<HostPiece>& pieces) {
  auto lock = h5::h5_lock();
  H5Id file = h5::create_file(path);
  h5::write_attr(file, "kolos.format", static_cast<int64_t>(kFormatVersion));
  h5::write_attr(file, "kolos.rank", static_cast<int64_t>(rank));
  for (const auto& p : pieces) {
    const Record& r = p.record;
    const std::string where = path + ": dataset " + slash(r.path);
    H5Id ds = h5::create_dataset(file, slash(r.path), r.dtype, r.length);
    if (H5Dwrite(ds, h5::memory_type(r.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                 p.data.data_ptr()) < 0) {
      h5::fail("cannot write " + where);
    }
    h5::write_attr(ds, "kolos.offset", r.offset);
    h5::write_attr(ds, "kolos.global_shape", r.global_shape);
    h5::write_attr(ds, "kolos.dtype", r.dtype);
    h5::write_attr(ds, "kolos.crc32c", static_cast<int64_t>(r.crc));
  }
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) h5::fail("cannot flush " + path);
  file.reset();
  fsync_path(path, false);
}

// Rank 0: every tensor's pieces agree on shape and dtype and cover it
// exactly once (their volumes add up and no two overlap).
void check_records(const std::vector<Record>& records) {
  std::map<std::string, std::vector<const Record*>> by_path;
  for (const auto& r : records) by_path[r.path].push_back(&r);
  for (const auto& [path, list] : by_path) {
    int64_t global = 1, sum = 0;
    for (auto d : list[0]->global_shape) global *= d;
    for (const Record* r : list) {
      if (r->global_shape != list[0]->global_shape || r->dtype != list[0]->dtype) {
        throw CheckpointError("tensor " + path + ": rank " + std::to_string(r->rank) + " holds a " +
                              r->dtype + " piece of " + shape_string(r->global_shape) +
                              ", rank " + std::to_string(list[0]->rank) + " a " + list[0]->dtype +
                              " piece of " + shape_string(list[0]->global_shape));
      }
      sum += r->numel();
    }
    for (size_t i = 0; i < list.size() && list.size() <= 4096; ++i) {
      for (size_t j = i + 1; j < list.size(); ++j) {
        bool overlap = true;
        for (size_t d = 0; d < list[i]->offset.size(); ++d) {
          const int64_t a0 = list[i]->offset[d], a1 = a0 + list[i]->length[d];
          const int64_t b0 = list[j]->offset[d], b1 = b0 + list[j]->length[d];
          overlap &= std::max(a0, b0) < std::min(a1, b1);
        }
        if (overlap) {
          throw CheckpointError("tensor " + path + ": the pieces of ranks " +
                                std::to_string(list[i]->rank) + " and " +
                                std::to_string(list[j]->rank) +
                                " overlap (a placement that does not mark its sharded axes?)");
        }
      }
    }
    if (sum != global) {
      throw CheckpointError("tensor " + path + ": its pieces hold " + std::to_string(sum) +
                            " of its " + std::to_string(global) + " elements");
    }
  }
}

void write_index(const std::string& path, const std::vector<Record>& records, const Metadata& meta,
                 const std::vector<int64_t>& writers) {
  auto lock = h5::h5_lock();
  H5Id file = h5::create_file(path);
  h5::write_attr(file, "kolos.format", static_cast<int64_t>(kFormatVersion));
  h5::write_attr(file, "kolos.version", meta.kolos_version);
  h5::write_attr(file, "step", meta.step);
  h5::write_attr(file, "data_position", meta.data_position);
  h5::write_attr(file, "optimizer_steps", meta.optimizer_steps);
  h5::write_attr(file, "config", meta.config_toml);
  if (meta.loss_scale > 0) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", meta.loss_scale);
    h5::write_attr(file, "loss_scale", std::string(text));
    h5::write_attr(file, "loss_scale_good_steps", meta.loss_scale_good_steps);
  }
  // The core's four axes, then each registered axis the mesh uses, by name.
  std::vector<int64_t> sizes{meta.mesh.pp, meta.mesh.dp, meta.mesh.sp, meta.mesh.tp};
  std::string names = "pp,dp,sp,tp";
  for (Axis a : axes_in_order()) {
    if (static_cast<int>(a) < kCoreAxes || meta.mesh.of(a) == 1) continue;
    sizes.push_back(meta.mesh.of(a));
    names += std::string(",") + to_string(a);
  }
  h5::write_attr(file, "mesh", sizes);
  h5::write_attr(file, "mesh_axes", names);
  h5::write_attr(file, "world_size", meta.world_size);
  h5::write_attr(file, "writers", writers);

  // Tensors in the order of their first appearance (rank 0's model order).
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Record*>> by_path;
  for (const auto& r : records) {
    if (!by_path.count(r.path)) order.push_back(r.path);
    by_path[r.path].push_back(&r);
  }
  std::string list;
  for (const auto& p : order) list += p + "\n";
  h5::write_attr(file, "tensors", list);

  if (!meta.rng_cpu.empty()) {
    const size_t n = meta.rng_cpu[0].size();
    bool same = n > 0;
    for (const auto& s : meta.rng_cpu) same &= s.size() == n;
    if (same) {
      std::vector<uint8_t> flat;
      for (const auto& s : meta.rng_cpu) flat.insert(flat.end(), s.begin(), s.end());
      H5Id ds = h5::create_dataset(
          file, "/rng/cpu", "uint8",
          {static_cast<int64_t>(meta.rng_cpu.size()), static_cast<int64_t>(n)});
      if (H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat.data()) < 0) {
        h5::fail("cannot write " + path + ": /rng/cpu");
      }
    }
  }

  for (const auto& tensor : order) {
    const auto& list_of = by_path[tensor];
    const Record& first = *list_of[0];
    const std::vector<int64_t> global = first.global_shape;
    std::vector<hsize_t> gdims(global.begin(), global.end());
    H5Id dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate");
    // Unmapped (missing) data reads as NaN, never as plausible zeros.
    if (first.dtype == "float32") {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan);
    } else if (first.dtype == "float64") {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &nan);
    }
    for (const Record* r : list_of) {
      H5Id vspace = h5::space(H5Screate_simple(static_cast<int>(gdims.size()), gdims.data(), nullptr),
                              "dataspace");
      std::vector<hsize_t> start(r->offset.begin(), r->offset.end());
      std::vector<hsize_t> block(r->length.begin(), r->length.end());
      std::vector<hsize_t> ones(block.size(), 1);
      H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start.data(), nullptr, ones.data(),
                          block.data());
      H5Id sspace = h5::space(
          H5Screate_simple(static_cast<int>(block.size()), block.data(), nullptr), "dataspace");
      if (H5Pset_virtual(dcpl, vspace, shard_name(r->rank).c_str(), slash(tensor).c_str(),
                         sspace) < 0) {
        h5::fail("cannot map " + tensor + " to " + shard_name(r->rank));
      }
    }
    H5Id ds = h5::create_dataset(file, slash(tensor), first.dtype, global, dcpl);
    h5::write_attr(ds, "kolos.dtype", first.dtype);
    h5::write_attr(ds, "kolos.pieces", static_cast<int64_t>(list_of.size()));
  }
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) h5::fail("cannot flush " + path);
  file.reset();
  fsync_path(path, false);
}

}  // namespace

int64_t Record::numel() const {
  int64_t n = 1;
  for (auto v : length) n *= v;
  return n;
}

std::string stored_dtype_name(at::ScalarType type) {
  const std::string name = dtype_name(type);
  if (!h5::known_dtype(name)) {
    throw CheckpointError("tensors of dtype " + name + " cannot be checkpointed yet");
  }
  return name;
}

std::vector<int64_t> file_shape(const std::vector<int64_t>& shape) {
  return shape.empty() ? std::vector<int64_t>{1} : shape;
}

// The gather's point-to-point messages; the checkpoint's group carries nothing else.
constexpr int kGatherTag = 1;

std::vector<std::string> gather_bytes(comm::ProcessGroup& group, const std::string& mine) {
  const int size = group.size();
  const int rank = group.rank();
  at::Tensor lengths = at::empty({size}, at::kLong);
  group.all_gather_flat(lengths, at::full({1}, static_cast<int64_t>(mine.size()), at::kLong))
      ->wait();
  std::vector<std::string> out;
  if (rank != 0) {
    if (!mine.empty()) {
      at::Tensor bytes = at::from_blob(const_cast<char*>(mine.data()),
                                       {static_cast<int64_t>(mine.size())}, at::kByte);
      group.send(bytes, 0, kGatherTag)->wait();
    }
    return out;
  }
  // Rank 0 posts every receive, then waits for them all.
  std::vector<at::Tensor> buffers(size);
  std::vector<comm::WorkPtr> works;
  for (int r = 1; r < size; ++r) {
    buffers[r] = at::empty({lengths[r].item<int64_t>()}, at::kByte);
    if (buffers[r].numel() > 0) works.push_back(group.recv(buffers[r], r, kGatherTag));
  }
  for (auto& work : works) work->wait();
  out.push_back(mine);
  for (int r = 1; r < size; ++r) {
    const auto* data = static_cast<const char*>(buffers[r].data_ptr());
    out.emplace_back(buffers[r].numel() > 0 ? std::string(data, buffers[r].numel()) : "");
  }
  return out;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | (directory ? O_DIRECTORY : 0));
  if (fd < 0) throw CheckpointError("cannot open " + path + " to fsync: " + std::strerror(errno));
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0) throw CheckpointError("fsync " + path + ": " + std::strerror(err));
}

SaveJob snapshot(const MeshLayout& layout, int rank, const std::string& dir,
                 const std::vector<Piece>& pieces, Metadata meta, bool copy) {
  SaveJob job;
  job.dir = dir;
  job.rank = rank;
  job.meta = std::move(meta);
  const Coords coords = layout.coords(rank);
  torch::NoGradGuard no_grad;
  for (const auto& p : pieces) {
    check_path(p.name);
    const Placement& pl = p.placement;
    // Replicas write once, from the canonical replica; empty pieces not at all.
    if (pl.piece_numel() == 0 || !pl.is_canonical_replica(coords)) continue;
    KOLOS_CHECK_KIND(kCheckpoint, p.tensor.defined(), "piece ", p.name, " has no tensor");
    KOLOS_CHECK_KIND(kCheckpoint, p.tensor.dim() == pl.dim(), "piece ", p.name, " is ",
                     p.tensor.dim(), "-d but its placement ", pl.to_string(), " is ", pl.dim(),
                     "-d");
    at::Tensor t = p.tensor.detach();
    for (int d = 0; d < pl.dim(); ++d) {
      KOLOS_CHECK_KIND(kCheckpoint, t.size(d) == pl.slice(d).padded, "piece ", p.name,
                       ": local extent ", t.size(d), " along dim ", d, ", placement says ",
                       pl.slice(d).padded);
      if (pl.slice(d).length != pl.slice(d).padded) t = t.narrow(d, 0, pl.slice(d).length);
    }
    t = t.to(at::kCPU);
    t = copy ? t.clone(at::MemoryFormat::Contiguous) : t.contiguous();
    HostPiece hp;
    hp.record.path = p.name;
    hp.record.dtype = stored_dtype_name(t.scalar_type());
    hp.record.rank = rank;
    hp.record.global_shape = file_shape(pl.global_shape());
    for (int d = 0; d < pl.dim(); ++d) {
      hp.record.offset.push_back(pl.slice(d).offset);
      hp.record.length.push_back(pl.slice(d).length);
    }
    if (pl.dim() == 0) {
      hp.record.offset = {0};
      hp.record.length = {1};
    }
    hp.data = t;
    job.mine.push_back(std::move(hp));
  }
  return job;
}

void run_job(comm::ProcessGroup& group, SaveJob& job) {
  const int rank = group.rank();
  const fs::path final_dir(job.dir);
  const fs::path root = final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path();
  const std::string name = final_dir.filename().string();
  const fs::path tmp = root / (".tmp-" + name);

  agree(group, rank != 0 ? "" : capture([&] {
          std::error_code ec;
          fs::create_directories(root, ec);
          if (ec) throw CheckpointError("cannot create " + root.string() + ": " + ec.message());
          fs::remove_all(tmp, ec);  // a save that died before
          if (!fs::create_directory(tmp, ec)) {
            throw CheckpointError("cannot create " + tmp.string() + ": " + ec.message());
          }
        }));

  agree(group, capture([&] {
          for (auto& p : job.mine) {
            const size_t bytes = static_cast<size_t>(p.data.numel()) * p.data.element_size();
            p.record.crc = crc32c(0, p.data.data_ptr(), bytes);
          }
          if (!job.mine.empty())
            write_shard((tmp / shard_name(job.rank)).string(), job.rank, job.mine);
          maybe_die(job.rank, job.meta.step);
        }));

  std::vector<std::string> texts = gather_bytes(group, serialize(job.mine));
  agree(group, rank != 0 ? "" : capture([&] {
          std::vector<Record> records;
          std::vector<int64_t> writers;
          for (size_t r = 0; r < texts.size(); ++r) {
            std::vector<Record> part = deserialize(texts[r]);
            if (!part.empty()) writers.push_back(static_cast<int64_t>(r));
            records.insert(records.end(), part.begin(), part.end());
          }
          check_records(records);
          write_index((tmp / "index.h5").string(), records, job.meta, writers);
          fsync_path(tmp.string(), true);
          std::error_code ec;
          const fs::path old = root / (".old-" + name);
          if (fs::exists(final_dir)) {  // saved again at the same step: replace
            fs::remove_all(old, ec);
            fs::rename(final_dir, old);
          }
          fs::rename(tmp, final_dir, ec);
          if (ec) {
            throw CheckpointError("cannot rename " + tmp.string() + " to " + final_dir.string() +
                                  ": " + ec.message());
          }
          fsync_path(root.string(), true);
          fs::remove_all(old, ec);
        }));
}

void update_latest(const std::string& root, const std::string& name) {
  const fs::path tmp = fs::path(root) / ".latest.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << name << "\n";
    out.flush();
    if (!out) throw CheckpointError("cannot write " + tmp.string());
  }
  fsync_path(tmp.string(), false);
  std::error_code ec;
  fs::rename(tmp, fs::path(root) / "latest", ec);
  if (ec) throw CheckpointError("cannot update " + root + "/latest: " + ec.message());
  fsync_path(root, true);
}

void prune(const std::string& root, int64_t keep_last) {
  if (keep_last <= 0) return;
  std::vector<std::string> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string n = entry.path().filename().string();
    if (entry.is_directory() && n.rfind("step-", 0) == 0) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());  // zero-padded: name order is step order
  const std::string keep = latest(root);
  for (size_t i = 0; i + keep_last < steps.size(); ++i) {
    if (steps[i] == keep) continue;  // never the one `latest` names
    fs::remove_all(fs::path(root) / steps[i], ec);
  }
}

// The torch side of the readers (reader.h).
int64_t cpu_rng_state_bytes() {
  static const int64_t bytes = at::detail::getDefaultCPUGenerator().get_state().numel();
  return bytes;
}

}  // namespace detail

// ---- public --------------------------------------------------------------------

void save_pieces(comm::ProcessGroup& group, const MeshLayout& layout, const std::string& dir,
                 const std::vector<Piece>& pieces, const Metadata& meta) {
  const int rank = group.rank();
  detail::SaveJob job;
  detail::agree(group, detail::capture([&] {
                  job = detail::snapshot(layout, rank, dir, pieces, meta, /*copy=*/false);
                }));
  detail::run_job(group, job);
}

Metadata load_pieces(comm::ProcessGroup& group, const std::string& dir_or_root,
                     const std::vector<Piece>& pieces, const std::string& only_under) {
  // With `only_under`, the checkpoint's other tensors are neither required
  // nor verified (inference reads "model/" and leaves the optimizer's).
  const auto wanted = [&](const std::string& tensor) {
    return only_under.empty() || tensor.rfind(only_under, 0) == 0;
  };
  // Run state under "state/" (a mixture block's balancing bias) may be
  // absent from the checkpoint (the run keeps its initial value) or absent
  // from the run (the checkpoint's is not read): kStatePrefix, checkpoint.h.
  const auto optional = [](const std::string& tensor) {
    return tensor.rfind(kStatePrefix, 0) == 0;
  };
  const int rank = group.rank();
  const int size = group.size();
  detail::IndexInfo index;
  detail::agree(group, detail::capture([&] {
                  index = detail::read_index(resolve(dir_or_root), /*with_rng=*/true);
                }));
  // Which of the checkpoint's tensors some rank of this run holds (under
  // pipelining each stage holds only its own blocks' tensors).
  at::Tensor held = at::zeros({static_cast<int64_t>(index.tensors.size())}, at::kInt);
  {
    std::set<std::string> mine;
    for (const auto& p : pieces) {
      if (p.placement.global_numel() > 0) mine.insert(p.name);
    }
    auto* flags = held.data_ptr<int32_t>();
    for (size_t i = 0; i < index.tensors.size(); ++i) {
      flags[i] = mine.count(index.tensors[i]) ? 1 : 0;
    }
    if (held.numel() > 0) group.all_reduce(held, comm::ReduceOp::kMax)->wait();
  }
  detail::agree(
      group, detail::capture([&] {
        const std::string where = index.dir + "/index.h5";
        // This run's tensors (over all ranks) and the checkpoint's must be the same set.
        std::set<std::string> ours, theirs(index.tensors.begin(), index.tensors.end());
        for (const auto& p : pieces) {
          if (p.placement.global_numel() > 0) ours.insert(p.name);
        }
        std::vector<std::string> missing, extra;
        for (const auto& t : ours) {
          if (!theirs.count(t) && !optional(t)) missing.push_back(t);
        }
        for (size_t i = 0; i < index.tensors.size(); ++i) {
          if (held.data_ptr<int32_t>()[i] == 0 && wanted(index.tensors[i]) &&
              !optional(index.tensors[i])) {
            extra.push_back(index.tensors[i]);
          }
        }
        if (!missing.empty() || !extra.empty()) {
          std::string msg = where + ": the checkpoint does not hold this run's tensors";
          if (!missing.empty()) msg += "; missing dataset /" + missing[0];
          if (missing.size() > 1) msg += " and " + std::to_string(missing.size() - 1) + " more";
          if (!extra.empty()) msg += "; dataset /" + extra[0] + " is not in this run";
          if (extra.size() > 1) msg += " (and " + std::to_string(extra.size() - 1) + " more)";
          throw CheckpointError(msg + " (a checkpoint of another model?)");
        }
        for (const auto& p : pieces) {
          if (p.placement.global_numel() == 0 || !index.shapes.count(p.name)) continue;
          const auto shape = detail::file_shape(p.placement.global_shape());
          if (index.shapes.at(p.name) != shape) {
            throw CheckpointError(where + ": dataset /" + p.name + " has shape " +
                                  shape_string(index.shapes.at(p.name)) + ", this run's is " +
                                  shape_string(shape) + " (a checkpoint of another model shape?)");
          }
          const std::string dtype = detail::stored_dtype_name(p.tensor.scalar_type());
          if (index.dtypes.at(p.name) != dtype) {
            throw CheckpointError(where + ": dataset /" + p.name + " is " +
                                  index.dtypes.at(p.name) + ", this run's tensor is " + dtype);
          }
        }
        for (const auto& problem : detail::coverage_problems(index)) throw CheckpointError(problem);
        for (size_t i = static_cast<size_t>(rank); i < index.mappings.size();
             i += static_cast<size_t>(size)) {
          if (!wanted(index.mappings[i].tensor)) continue;
          const std::string problem = detail::verify_mapping(index, index.mappings[i]);
          if (!problem.empty()) throw CheckpointError(problem);
        }
      }));

  detail::agree(
      group, detail::capture([&] {
        auto lock = h5::h5_lock();
        const std::string path = index.dir + "/index.h5";
        h5::H5Id file = h5::open_file_read(path);
        torch::NoGradGuard no_grad;
        for (const auto& p : pieces) {
          const Placement& pl = p.placement;
          if (pl.has_padding() || pl.piece_numel() == 0) p.tensor.zero_();  // padding reads as 0
          if (pl.global_numel() == 0 || pl.piece_numel() == 0) continue;
          if (!index.shapes.count(p.name)) continue;  // optional state the checkpoint lacks
          const std::string where = path + ": dataset /" + p.name;
          h5::H5Id ds = h5::dataset(H5Dopen2(file, ("/" + p.name).c_str(), H5P_DEFAULT), where);
          std::vector<hsize_t> start, count;
          std::vector<int64_t> piece_shape;
          for (int d = 0; d < pl.dim(); ++d) {
            start.push_back(static_cast<hsize_t>(pl.slice(d).offset));
            count.push_back(static_cast<hsize_t>(pl.slice(d).length));
            piece_shape.push_back(pl.slice(d).length);
          }
          if (pl.dim() == 0) {
            start = {0};
            count = {1};
          }
          h5::H5Id fspace = h5::space(H5Dget_space(ds), where);
          H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
          h5::H5Id mspace = h5::space(
              H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), where);
          at::Tensor buffer = torch::empty(piece_shape, p.tensor.options().device(at::kCPU));
          const std::string dtype = detail::stored_dtype_name(buffer.scalar_type());
          if (H5Dread(ds, h5::memory_type(dtype), mspace, fspace, H5P_DEFAULT, buffer.data_ptr()) <
              0) {
            h5::fail("cannot read " + where);
          }
          at::Tensor target = p.tensor;
          for (int d = 0; d < pl.dim(); ++d) target = target.narrow(d, 0, pl.slice(d).length);
          target.copy_(buffer);
        }
      }));
  return index.meta;
}

}  // namespace kolos::checkpoint
