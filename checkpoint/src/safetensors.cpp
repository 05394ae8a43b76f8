// safetensors in (read_safetensors, read_safetensors_dir) and a checkpoint
// written without MPI (write_initial_checkpoint): what `kolos ckpt import`
// is made of.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}) and the data, offsets counted from the byte after
// the header. Files come from the internet, so every number is checked
// against the file before it sizes anything.
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/config.h"
#include "kolos/core/dtype_torch.h"
#include "kolos/core/mesh_layout.h"
#include "store_detail.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace kolos::checkpoint {
namespace {

// Headers of real models are a few MB (a tensor entry is ~100 bytes); this
// bounds what a malformed length makes us allocate.
constexpr uint64_t kMaxHeaderBytes = 256ull << 20;

struct Entry {
  std::string name;
  const DtypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

}  // namespace

NamedTensors read_safetensors(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CheckpointError("cannot open " + file);
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t header_size = 0;
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(&header_size), 8)) {
    throw CheckpointError(file +
                          ": not a safetensors file (shorter than its 8-byte header length)");
  }
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    throw CheckpointError(file + ": not a safetensors file (header length " +
                          std::to_string(header_size) + " bytes, the file has " +
                          std::to_string(file_size) + ")");
  }
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw CheckpointError(file + ": safetensors header is not JSON: " + e.what());
  }
  if (!header.is_object()) throw CheckpointError(file + ": safetensors header is not an object");
  const uint64_t data_size = file_size - 8 - header_size;

  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = file + ": tensor `" + name + "`";
    Entry e;
    e.name = name;
    try {
      const std::string tag = info.at("dtype").get<std::string>();
      e.dtype = find_dtype_by_safetensors(tag);
      if (e.dtype == nullptr)
        throw CheckpointError(where + " has dtype " + tag + ", which kolos cannot read");
      uint64_t numel = 1;
      for (const auto& d : info.at("shape")) {
        const int64_t v = d.get<int64_t>();
        if (v < 0 || (v > 0 && numel > (uint64_t{1} << 62) / static_cast<uint64_t>(v))) {
          throw CheckpointError(where + " has an impossible shape " + info.at("shape").dump());
        }
        e.shape.push_back(v);
        numel *= static_cast<uint64_t>(v);
      }
      const auto& offsets = info.at("data_offsets");
      if (!offsets.is_array() || offsets.size() != 2) {
        throw CheckpointError(where + ": data_offsets is not [begin, end]");
      }
      e.begin = offsets[0].get<uint64_t>();
      e.end = offsets[1].get<uint64_t>();
      if (e.begin > e.end || e.end > data_size) {
        throw CheckpointError(where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                              std::to_string(e.end) + "] lie outside the file's " +
                              std::to_string(data_size) + " data bytes");
      }
      if (e.end - e.begin != numel * static_cast<uint64_t>(e.dtype->size)) {
        throw CheckpointError(where + ": " + std::to_string(e.end - e.begin) + " bytes for shape " +
                              info.at("shape").dump() + " of " + e.dtype->name);
      }
    } catch (const json::exception& ex) {
      throw CheckpointError(where + ": malformed entry " + info.dump() + " (" + ex.what() + ")");
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      throw CheckpointError(file + ": tensors `" + entries[i - 1].name + "` and `" +
                            entries[i].name + "` overlap");
    }
  }

  NamedTensors out;
  for (const Entry& e : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(scalar_type(*e.dtype)));
    in.seekg(static_cast<std::streamoff>(8 + header_size + e.begin));
    if (!in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin))) {
      throw CheckpointError(file + ": tensor `" + e.name + "` is cut short");
    }
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

NamedTensors read_safetensors_dir(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index_path)) {
    if (!fs::exists(single)) {
      throw CheckpointError(dir + ": neither model.safetensors nor model.safetensors.index.json");
    }
    return read_safetensors(single.string());
  }
  std::ifstream in(index_path);
  json index;
  try {
    index = json::parse(in);
  } catch (const json::exception& e) {
    throw CheckpointError(index_path.string() + " is not JSON: " + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw CheckpointError(index_path.string() + " has no weight_map object");
  }
  std::map<std::string, std::string> shard_of;  // tensor -> shard file
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      throw CheckpointError(index_path.string() + ": weight_map[\"" + name +
                            "\"] is not a file name");
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      throw CheckpointError(index_path.string() + ": weight_map[\"" + name + "\"] = \"" + f +
                            "\" is not a file in " + dir);
    }
    shard_of[name] = f;
    shards.insert(f);
  }
  NamedTensors out;
  std::map<std::string, std::string> seen_in;
  for (const std::string& shard : shards) {
    for (auto& [name, tensor] : read_safetensors((fs::path(dir) / shard).string())) {
      const auto it = shard_of.find(name);
      if (it == shard_of.end()) {
        throw CheckpointError(dir + "/" + shard + ": tensor `" + name + "` is not in " +
                              index_path.filename().string() + "'s weight_map");
      }
      if (it->second != shard) {
        throw CheckpointError(dir + "/" + shard + ": tensor `" + name + "` is also here, but " +
                              index_path.filename().string() + " places it in " + it->second);
      }
      seen_in[name] = shard;
      out.emplace_back(name, std::move(tensor));
    }
  }
  for (const auto& [name, shard] : shard_of) {
    if (!seen_in.count(name)) {
      throw CheckpointError(dir + "/" + shard + " has no tensor `" + name + "`, which " +
                            index_path.filename().string() + " places there");
    }
  }
  return out;
}

namespace {

class DoneWork final : public comm::Work {
 public:
  bool is_completed() const override { return true; }
  void wait(std::chrono::milliseconds) override {}
};

// The one-rank group a checkpoint written by one process (no MPI) saves over:
// every collective of a group of one is the identity.
class SoloGroup final : public comm::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "none"; }
  comm::WorkPtr all_reduce(const at::Tensor&, comm::ReduceOp) override { return done(); }
  comm::WorkPtr all_gather_flat(const at::Tensor& output, const at::Tensor& input) override {
    if (output.data_ptr() != input.data_ptr()) output.view(-1).copy_(input.view(-1));
    return done();
  }
  comm::WorkPtr all_gather(const std::vector<at::Tensor>& outputs,
                           const at::Tensor& input) override {
    if (outputs.at(0).data_ptr() != input.data_ptr()) outputs[0].copy_(input);
    return done();
  }
  comm::WorkPtr broadcast(const at::Tensor&, int) override { return done(); }
  comm::WorkPtr barrier() override { return done(); }
  comm::CommStats stats() const override { return {}; }
  void reset_stats() override {}

 private:
  static comm::WorkPtr done() { return std::make_shared<DoneWork>(); }
  std::string name_ = "solo";
};

}  // namespace

std::string write_initial_checkpoint(const std::string& root, const NamedTensors& weights,
                                     const std::string& config_toml) {
  MeshShape shape;  // 1 x 1 x 1 x 1
  const MeshLayout layout(shape);
  std::vector<Piece> pieces;
  for (const auto& [name, tensor] : weights) {
    at::Tensor t = tensor.to(at::kFloat).contiguous();
    const Placement whole = Placement::replicated(t.sizes().vec());
    pieces.push_back(Piece{"model/" + name, t, whole});
    pieces.push_back(Piece{"optim/exp_avg/" + name, at::zeros_like(t), whole});
    pieces.push_back(Piece{"optim/exp_avg_sq/" + name, at::zeros_like(t), whole});
  }
  Metadata meta;
  meta.config_toml = config_toml;
  meta.kolos_version = KOLOS_VERSION;
  meta.mesh = shape;
  meta.world_size = 1;
  fs::create_directories(root);
  const std::string name = step_dir_name(0);
  const std::string dir = (fs::path(root) / name).string();
  if (fs::exists(dir)) {
    throw CheckpointError(dir + " exists already; import into an empty or new directory");
  }
  SoloGroup group;
  save_pieces(group, layout, dir, pieces, meta);
  detail::update_latest(root, name);
  return dir;
}

}  // namespace kolos::checkpoint
