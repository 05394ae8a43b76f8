// `kolos ckpt inspect | verify | export`: single-process readers of a
// checkpoint directory, and the safetensors writer. Every size they take
// from a file is bounded before anything is allocated (see store_detail.h's
// limits and h5::extents).
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "h5.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/dtype_torch.h"
#include "store_detail.h"

namespace fs = std::filesystem;

namespace kolos::checkpoint {
namespace {

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

const char* safetensors_dtype(const std::string& dtype) {
  const DtypeInfo* d = find_dtype(dtype);
  if (d == nullptr) throw CheckpointError("no safetensors dtype for " + dtype);
  return d->safetensors;
}

}  // namespace

Inspection inspect(const std::string& path) {
  const std::string dir = resolve(path);
  detail::IndexInfo index = detail::read_index(dir, /*with_rng=*/true);
  Inspection out;
  out.dir = dir;
  out.meta = index.meta;
  out.writers = index.writers;
  for (const auto& t : index.tensors) {
    TensorInfo info{t, index.shapes[t], index.dtypes[t], 0};
    for (const auto& m : index.mappings) info.pieces += m.tensor == t;
    out.tensors.push_back(info);
  }
  return out;
}

std::string format_inspection(const Inspection& in) {
  std::ostringstream out;
  const Metadata& m = in.meta;
  out << "checkpoint " << in.dir << "\n"
      << "  kolos " << m.kolos_version << ", step " << m.step << ", data position "
      << m.data_position << " samples, optimizer steps " << m.optimizer_steps << "\n"
      << "  written by mesh " << MeshLayout(m.mesh).describe() << " (" << m.world_size
      << " ranks; " << in.writers.size()
      << " wrote shards)\n"
      << "  rng states: " << m.rng_cpu.size() << " ranks\n";
  int64_t total = 0;
  size_t width = 0;
  for (const auto& t : in.tensors) width = std::max(width, t.path.size());
  out << "  tensors (" << in.tensors.size() << "):\n";
  for (const auto& t : in.tensors) {
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    total += n;
    out << "    /" << t.path << std::string(width - t.path.size() + 2, ' ') << t.dtype << " "
        << shape_string(t.shape) << "  " << t.pieces << (t.pieces == 1 ? " piece" : " pieces")
        << "\n";
  }
  out << "  " << total << " elements in all\n";
  return out.str();
}

namespace {

// The checkpoint `path` names, verified: CheckpointError with the first problem.
std::string sound_checkpoint(const std::string& path) {
  const std::string dir = resolve(path);
  const std::vector<std::string> problems = verify(dir);
  if (!problems.empty()) {
    throw CheckpointError(problems[0] + (problems.size() > 1
                                             ? " (and " + std::to_string(problems.size() - 1) +
                                                   " more problems; see `kolos ckpt verify`)"
                                             : std::string()));
  }
  return dir;
}

// Writes `body` after the safetensors header `header` (padded to 8 bytes)
// into out_file atomically: temporary file, fsync, rename.
void write_safetensors_file(const std::string& out_file, std::string header,
                            const std::function<void(std::ofstream&)>& body) {
  while (header.size() % 8 != 0) header += ' ';
  const std::string tmp = out_file + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw CheckpointError("cannot write " + tmp);
  const uint64_t header_size = header.size();
  out.write(reinterpret_cast<const char*>(&header_size), 8);  // little-endian (x86, arm64)
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  body(out);
  out.close();
  if (!out) throw CheckpointError("cannot write " + tmp);
  detail::fsync_path(tmp, false);
  std::error_code ec;
  fs::rename(tmp, out_file, ec);
  if (ec) throw CheckpointError("cannot rename " + tmp + " to " + out_file + ": " + ec.message());
}

// One header entry: ,"name":{"dtype":..,"shape":[..],"data_offsets":[..]}
void header_entry(std::ostringstream& header, const std::string& name, const std::string& dtype,
                  const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  header << ",\"" << json_escape(name) << "\":{\"dtype\":\"" << safetensors_dtype(dtype)
         << "\",\"shape\":[";
  for (size_t i = 0; i < shape.size(); ++i) header << (i ? "," : "") << shape[i];
  header << "],\"data_offsets\":[" << begin << "," << end << "]}";
}

}  // namespace

int64_t export_safetensors(const std::string& path, const std::string& out_file) {
  const std::string dir = sound_checkpoint(path);
  detail::IndexInfo index = detail::read_index(dir, /*with_rng=*/false);
  // Header: name -> dtype, shape, byte range; then the data, in that order.
  std::vector<std::string> names;
  for (const auto& t : index.tensors) {
    if (t.rfind("model/", 0) == 0) names.push_back(t);
  }
  std::ostringstream header;
  header << "{\"__metadata__\":{\"format\":\"pt\",\"kolos.step\":\"" << index.meta.step
         << "\",\"kolos.version\":\"" << json_escape(index.meta.kolos_version) << "\"}";
  int64_t offset = 0;
  for (const auto& t : names) {
    int64_t n = 1;
    for (auto d : index.shapes[t]) n *= d;
    const int64_t bytes = n * h5::element_size(index.dtypes[t]);
    header_entry(header, t.substr(6), index.dtypes[t], index.shapes[t], offset, offset + bytes);
    offset += bytes;
  }
  header << "}";

  write_safetensors_file(out_file, header.str(), [&](std::ofstream& out) {
    auto lock = h5::h5_lock();
    h5::H5Id file = h5::open_file_read(dir + "/index.h5");
    for (const auto& t : names) {
      // Whole rows at a time (dim 0), a bounded buffer, through the VDS.
      const std::string where = dir + "/index.h5: dataset /" + t;
      h5::H5Id ds = h5::dataset(H5Dopen2(file, ("/" + t).c_str(), H5P_DEFAULT), where);
      h5::read_rows(ds, index.shapes[t], index.dtypes[t], detail::kChunkBytes, where,
                    [&](const char* data, size_t bytes) {
                      out.write(data, static_cast<std::streamsize>(bytes));
                    });
    }
  });
  return static_cast<int64_t>(names.size());
}

ModelWeights read_model_weights(const std::string& path) {
  const std::string dir = sound_checkpoint(path);
  detail::IndexInfo index = detail::read_index(dir, /*with_rng=*/false);
  // The dtype table's row of the name the index records.
  const auto scalar_type = [&](const std::string& dtype, const std::string& where) {
    const DtypeInfo* d = find_dtype(dtype);
    if (d == nullptr) throw CheckpointError(where + ": unknown dtype " + dtype);
    return kolos::scalar_type(*d);
  };
  ModelWeights weights;
  weights.meta = index.meta;
  auto lock = h5::h5_lock();
  h5::H5Id file = h5::open_file_read(dir + "/index.h5");
  for (const auto& t : index.tensors) {
    if (t.rfind("model/", 0) != 0) continue;
    const std::string where = dir + "/index.h5: dataset /" + t;
    at::Tensor tensor =
        at::empty(index.shapes[t], at::TensorOptions().dtype(scalar_type(index.dtypes[t], where)));
    char* into = static_cast<char*>(tensor.data_ptr());
    h5::H5Id ds = h5::dataset(H5Dopen2(file, ("/" + t).c_str(), H5P_DEFAULT), where);
    h5::read_rows(ds, index.shapes[t], index.dtypes[t], detail::kChunkBytes, where,
                  [&](const char* data, size_t bytes) {
                    std::memcpy(into, data, bytes);
                    into += bytes;
                  });
    weights.tensors.emplace_back(t.substr(6), std::move(tensor));
  }
  return weights;
}

void write_safetensors(const std::string& file, const NamedTensors& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::ostringstream header;
  header << "{\"__metadata__\":{";
  for (size_t i = 0; i < metadata.size(); ++i) {
    header << (i ? "," : "") << "\"" << json_escape(metadata[i].first) << "\":\""
           << json_escape(metadata[i].second) << "\"";
  }
  header << "}";
  std::vector<at::Tensor> contiguous;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    contiguous.push_back(t.contiguous());
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    header_entry(header, name, dtype_name(t.scalar_type()), t.sizes().vec(), offset,
                 offset + bytes);
    offset += bytes;
  }
  header << "}";
  write_safetensors_file(file, header.str(), [&](std::ofstream& out) {
    for (const auto& t : contiguous) {
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    }
  });
}

}  // namespace kolos::checkpoint
