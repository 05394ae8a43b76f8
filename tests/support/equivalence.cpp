#include "equivalence.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "error_of.h"
#include "kolos/core/comm/mpi.h"
#include "kolos/core/error.h"
#include "kolos/core/memory_estimate.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos::testing {

std::vector<std::vector<std::string>> grid_layouts() {
  if (world_size() == 4) return {{"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""}};
  if (world_size() == 8) {
    return {{"parallel.tensor.size=8", "parallel.tensor.mode=\"2.5d\"", "parallel.tensor.depth=2"},
            {"parallel.tensor.size=8", "parallel.tensor.mode=\"3d\""}};
  }
  return {};
}

RunConfig tiny_run_config(const std::string& model_section, const std::string& origin,
                          const std::vector<std::string>& overrides) {
  static const char* kRun = R"(
[data]
kind = "synthetic"

[optim]
lr = 3e-3
warmup_steps = 3
min_lr = 3e-4
weight_decay = 0.01
grad_clip = 1.0

[train]
global_batch = 16
micro_batch = 4
steps = 20
seed = 7

[log]
progress = "off"
)";
  return parse_run_config(model_section + kRun, origin, overrides);
}

RunConfig tiny_gpt_config(const std::vector<std::string>& overrides) {
  static const std::string model = [] {
    std::ifstream in(KOLOS_TINY_GPT_TOML);
    if (!in) throw std::runtime_error("cannot read " KOLOS_TINY_GPT_TOML);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }();
  return tiny_run_config(model, "<tiny-gpt>", overrides);
}

RunConfig TinyModel::serial(std::vector<std::string> overrides) const {
  overrides.push_back("parallel.data=1");
  return make_(overrides);
}

std::string TinyModel::config_error(const std::vector<std::string>& overrides) const {
  return message_of<ConfigError>([&] { make_(overrides); });
}

TinyModel tiny_image_model(const std::string& name, const std::string& model_lines,
                           const std::vector<std::string>& defaults) {
  const std::string model = "[model]\nname = \"" + name +
                            "\"\nlayers = 2\nhidden = 32\nheads = 4\nimage_size = 8\n"
                            "patch_size = 4\nchannels = 2\nclasses = 5\n" +
                            model_lines;
  std::vector<std::string> first = {"train.steps=12"};
  first.insert(first.end(), defaults.begin(), defaults.end());
  return TinyModel([=](const std::vector<std::string>& overrides) {
    std::vector<std::string> all = first;
    all.insert(all.end(), overrides.begin(), overrides.end());
    return tiny_run_config(model, "<tiny-" + name + ">", all);
  });
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

comm::ProcessGroupPtr world_group() {
  return comm::make_mpi_process_group(MPI_COMM_WORLD, "world");
}

comm::ProcessGroupPtr self_group() { return comm::make_mpi_process_group(MPI_COMM_SELF, "self"); }

comm::ProcessGroupPtr first_ranks(int n) {
  return world_group()->split(world_rank() < n ? 0 : -1, world_rank(),
                              "first " + std::to_string(n) + " ranks");
}

std::string shared_tmpdir(const std::string& tag) {
  std::string dir;
  if (world_rank() == 0) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("kolos-" + tag + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern);
    dir = pattern;
  }
  int n = static_cast<int>(dir.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  dir.resize(n);
  MPI_Bcast(dir.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return dir;
}

std::string config_error(const std::vector<std::string>& overrides) {
  try {
    // At the fewest ranks the config's mesh fits, as `kolos check` does.
    const RunConfig config = tiny_gpt_config(overrides);
    plan_run(config, fewest_ranks(config));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

RunRecord run_and_record(const RunConfig& config, const comm::ProcessGroupPtr& group) {
  modules::register_builtin_models();
  Engine engine(config, group, [](const RunConfig& c) { return data::make_source(c); });
  RunRecord record;
  record.losses =
      engine.train([&](const StepMetrics& m) { record.grad_norms.push_back(m.grad_norm); }).losses;
  record.parameters = engine.gathered_parameters();
  return record;
}

namespace {

// MPI_Bcast over the world whose receivers sleep between polls instead of
// spinning in MPI (Open MPI's blocking collectives busy-wait).
void broadcast_asleep(void* data, int64_t bytes) {
  MPI_Request request;
  MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD, &request);
  auto pause = std::chrono::microseconds(20);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

void put(std::vector<char>& out, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  out.insert(out.end(), p, p + bytes);
}
template <typename T>
void put(std::vector<char>& out, const T& value) {
  put(out, &value, sizeof value);
}

struct Reader {
  const char* at;
  void get(void* data, size_t bytes) {
    std::memcpy(data, at, bytes);
    at += bytes;
  }
  template <typename T>
  T get() {
    T value;
    get(&value, sizeof value);
    return value;
  }
};

std::vector<char> pack(const RunRecord& r) {
  std::vector<char> out;
  for (const auto* v : {&r.losses, &r.grad_norms}) {
    put(out, static_cast<int64_t>(v->size()));
    put(out, v->data(), v->size() * sizeof(double));
  }
  put(out, static_cast<int64_t>(r.parameters.size()));
  for (const auto& [name, tensor] : r.parameters) {
    const at::Tensor t = tensor.detach().cpu().contiguous();
    put(out, static_cast<int64_t>(name.size()));
    put(out, name.data(), name.size());
    put(out, static_cast<int64_t>(t.scalar_type()));
    put(out, static_cast<int64_t>(t.dim()));
    for (int64_t d : t.sizes()) put(out, d);
    put(out, t.data_ptr(), t.nbytes());
  }
  return out;
}

RunRecord unpack(const std::vector<char>& bytes) {
  RunRecord r;
  Reader in{bytes.data()};
  for (auto* v : {&r.losses, &r.grad_norms}) {
    v->resize(in.get<int64_t>());
    in.get(v->data(), v->size() * sizeof(double));
  }
  const auto n = in.get<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::string name(in.get<int64_t>(), '\0');
    in.get(name.data(), name.size());
    const auto type = static_cast<at::ScalarType>(in.get<int64_t>());
    std::vector<int64_t> sizes(in.get<int64_t>());
    for (auto& d : sizes) d = in.get<int64_t>();
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(type));
    in.get(t.data_ptr(), t.nbytes());
    r.parameters.emplace_back(std::move(name), std::move(t));
  }
  return r;
}

}  // namespace

RunRecord serial_record(const RunConfig& config) {
  RunRecord record;
  std::vector<char> bytes;
  // The record's bytes; negative: rank 0's run failed, and the bytes are
  // its message, which every rank then throws.
  int64_t size = 0;
  if (world_rank() == 0) {
    try {
      record = run_and_record(config, self_group());
      bytes = pack(record);
      size = static_cast<int64_t>(bytes.size());
    } catch (const std::exception& e) {
      const std::string what = std::string("the serial reference failed on rank 0: ") + e.what();
      bytes.assign(what.begin(), what.end());
      size = -static_cast<int64_t>(bytes.size());
    }
  }
  broadcast_asleep(&size, sizeof size);
  bytes.resize(static_cast<size_t>(std::abs(size)));
  broadcast_asleep(bytes.data(), std::abs(size));
  if (size < 0) throw std::runtime_error(std::string(bytes.begin(), bytes.end()));
  return world_rank() == 0 ? record : unpack(bytes);
}

void expect_records_bit_equal(const RunRecord& reference, const RunRecord& candidate,
                              const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(reference.losses.size(), candidate.losses.size());
  for (size_t s = 0; s < reference.losses.size(); ++s) {
    EXPECT_EQ(reference.losses[s], candidate.losses[s]) << "loss of step " << s + 1;
    EXPECT_EQ(reference.grad_norms.at(s), candidate.grad_norms.at(s))
        << "gradient norm of step " << s + 1;
  }
  ASSERT_EQ(reference.parameters.size(), candidate.parameters.size());
  for (size_t i = 0; i < reference.parameters.size(); ++i) {
    const auto& [name, p] = reference.parameters[i];
    EXPECT_EQ(name, candidate.parameters[i].first);
    EXPECT_TRUE(torch::equal(p, candidate.parameters[i].second))
        << name << ": max |diff| "
        << (p - candidate.parameters[i].second).abs().max().item<double>();
  }
}

void expect_records_match(const RunRecord& reference, const RunRecord& candidate,
                          const Tolerance& tolerance, const std::string& what) {
  ASSERT_EQ(reference.losses.size(), candidate.losses.size()) << what;
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    const double a = reference.losses[i], b = candidate.losses[i];
    EXPECT_LE(std::abs(a - b), tolerance.loss_rel * std::abs(a))
        << what << ": loss of step " << i + 1 << " differs: reference " << a << ", got " << b;
  }
  ASSERT_EQ(reference.grad_norms.size(), candidate.grad_norms.size()) << what;
  for (size_t i = 0; i < reference.grad_norms.size(); ++i) {
    const double a = reference.grad_norms[i], b = candidate.grad_norms[i];
    EXPECT_LE(std::abs(a - b), tolerance.grad_norm_rel * std::abs(a))
        << what << ": gradient norm of step " << i + 1 << " differs: reference " << a << ", got "
        << b;
  }
  ASSERT_EQ(reference.parameters.size(), candidate.parameters.size()) << what;
  for (size_t i = 0; i < reference.parameters.size(); ++i) {
    const auto& [name, ref] = reference.parameters[i];
    const auto& [cand_name, cand] = candidate.parameters[i];
    EXPECT_EQ(name, cand_name) << what;
    ASSERT_EQ(ref.sizes(), cand.sizes()) << what << ": parameter " << name;
    const double diff = (ref - cand).abs().max().item<double>();
    EXPECT_LE(diff, tolerance.param_abs)
        << what << ": parameter " << name << " differs by up to " << diff;
  }
  // The run must have learned something, or equality proves little.
  EXPECT_LT(reference.losses.back(), reference.losses.front()) << what << ": loss did not fall";
}

void expect_equivalent(const RunConfig& reference, const RunConfig& candidate,
                       const Tolerance& tolerance) {
  RunRecord serial = serial_record(reference);
  RunRecord parallel = run_and_record(candidate, world_group());
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::ostringstream what;
  what << candidate.source << " on " << size << " ranks";
  expect_records_match(serial, parallel, tolerance, what.str());
}

std::vector<Mix> two_rank_mixes() {
  return {{"dp", {"parallel.data=2"}, {}},
          {"zero1", {"parallel.zero.stage=1"}, {}},
          {"zero2", {"parallel.zero.stage=2"}, {}},
          {"zero3", {"parallel.zero.stage=3"}, {}},
          {"tp1d", {"parallel.tensor.size=2"}, {}},
          {"pipeline_1f1b",
           {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""},
           {"train.micro_batch=2"}}};
}

std::string mix_name(const ::testing::TestParamInfo<Mix>& info) { return info.param.name; }

void expect_mix_matches_serial(const Mix& mix, const TinyModel& tiny) {
  std::vector<std::string> parallel = mix.shape;
  parallel.insert(parallel.end(), mix.parallel.begin(), mix.parallel.end());
  expect_equivalent(tiny.serial(mix.shape), tiny(parallel));
}

}  // namespace kolos::testing
