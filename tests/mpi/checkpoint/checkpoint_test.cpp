// Checkpoints across meshes, as real MPI runs (np 1, 2, 4).
//
// - Placement level: tensors sharded over tp and dp with uneven, padded and
//   empty shards are saved under one layout and read back under others; the
//   hyperslab/VDS logic is tested without any strategy plugin.
// - The resharding matrix: save under layout A, load under layout B, for
//   every pair of rows of kLayouts that fits the world: every global tensor
//   (parameters and optimizer states) equal bit for bit after load, and
//   training on under B gives the losses of an uninterrupted run under B
//   (exactly when A == B). A new strategy is one row.
// - Resume: 20 steps straight vs 10, save, a new engine, load, 10 more:
//   identical losses and final parameters, synchronous and asynchronous.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>

#include "equivalence.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/engine.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace fs = std::filesystem;

namespace kolos {
namespace {

using testing::shared_tmpdir;
using testing::world_rank;
using testing::world_size;

// The first `n` ranks of the world (no group on the others).
struct SubGroup {
  comm::ProcessGroupPtr group;
  explicit SubGroup(int n) : group(testing::first_ranks(n)) {}
  bool member() const { return group != nullptr; }
};

// Rank 0's tensors, on every rank of the world.
std::vector<at::Tensor> broadcast_from_0(std::vector<at::Tensor> tensors, int64_t count) {
  int64_t n = static_cast<int64_t>(tensors.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  EXPECT_EQ(n, count);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> shape;
    int64_t dims = world_rank() == 0 ? tensors[i].dim() : 0;
    MPI_Bcast(&dims, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    shape.resize(dims);
    if (world_rank() == 0) shape = tensors[i].sizes().vec();
    MPI_Bcast(shape.data(), static_cast<int>(dims), MPI_INT64_T, 0, MPI_COMM_WORLD);
    at::Tensor t = world_rank() == 0 ? tensors[i].to(torch::kFloat).contiguous()
                                     : torch::empty(shape, torch::kFloat);
    MPI_Bcast(t.data_ptr<float>(), static_cast<int>(t.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    out.push_back(t);
  }
  return out;
}

// ---- Placement level ----------------------------------------------------------

at::Tensor global_value(const std::vector<int64_t>& shape, double base) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return (torch::arange(n, torch::kDouble) * 0.37 + base).reshape(shape);
}

struct SyntheticTensor {
  std::string path;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};
const std::vector<SyntheticTensor> kSynthetic = {
    {"model/a", {10, 7}, torch::kFloat},
    {"model/b", {13}, torch::kDouble},
    {"model/c", {5, 6, 3}, torch::kFloat},
    {"optim/exp_avg/a", {10, 7}, torch::kFloat},
    {"model/idx", {9}, torch::kLong},
};

// A placement per tensor for a layout: `kind` picks how each tensor is cut.
using PlacementFn = std::function<Placement(const SyntheticTensor&, const MeshLayout&, int64_t)>;

struct SyntheticLayout {
  std::string name;
  MeshShape shape;
  PlacementFn place;
};

std::vector<SyntheticLayout> synthetic_layouts() {
  return {
      {"replicated x1", MeshShape{1, 1, 1, 1},
       [](const SyntheticTensor& t, const MeshLayout&, int64_t) {
         return Placement::replicated(t.shape);
       }},
      // tp on dim 0, then ZeRO-style over dp on the last dim (uneven, padded).
      {"tp2 x dp2, padded", MeshShape{1, 2, 1, 2},
       [](const SyntheticTensor& t, const MeshLayout& l, int64_t rank) {
         const Coords c = l.coords(rank);
         Placement p = Placement::replicated(t.shape)
                           .shard(0, c[3], 2, AxisSet{Axis::kTP});
         if (p.dim() == 1) return p;  // 1-d: tp shards, replicated over dp
         return p.shard(p.dim() - 1, c[1], 2, AxisSet{Axis::kDP});
       }},
      // 4-way on dim 0 over dp x tp (13 -> 4,4,4,1; 5 -> 2,2,1,0: an empty shard).
      {"dp2 x tp2 as 4 parts on dim 0", MeshShape{1, 2, 1, 2},
       [](const SyntheticTensor& t, const MeshLayout& l, int64_t rank) {
         const AxisSet axes{Axis::kDP, Axis::kTP};
         return Placement::replicated(t.shape).shard(0, l.index_in_group(rank, axes), 4, axes);
       }},
      // dp4 on the last dim; tensors with a short last dim get empty shards.
      {"dp4 on the last dim", MeshShape{1, 4, 1, 1},
       [](const SyntheticTensor& t, const MeshLayout& l, int64_t rank) {
         return Placement::replicated(t.shape).shard(static_cast<int>(t.shape.size()) - 1,
                                                     l.coords(rank)[1], 4, AxisSet{Axis::kDP});
       }},
      // tp2 sharded, replicated over dp2: replicas must be written once.
      {"tp2 replicated over dp2", MeshShape{1, 2, 1, 2},
       [](const SyntheticTensor& t, const MeshLayout& l, int64_t rank) {
         return Placement::replicated(t.shape).shard(0, l.coords(rank)[3], 2, AxisSet{Axis::kTP});
       }},
  };
}

std::vector<checkpoint::Piece> synthetic_pieces(const SyntheticLayout& layout, int64_t rank,
                                                bool filled) {
  MeshLayout mesh(layout.shape);
  std::vector<checkpoint::Piece> pieces;
  for (size_t i = 0; i < kSynthetic.size(); ++i) {
    const auto& t = kSynthetic[i];
    Placement pl = layout.place(t, mesh, rank);
    at::Tensor local =
        filled ? local_piece(global_value(t.shape, 100.0 * i).to(t.dtype), pl)
               : torch::full(pl.local_shape(), -7, torch::TensorOptions().dtype(t.dtype));
    pieces.push_back(checkpoint::Piece{t.path, local, pl});
  }
  return pieces;
}

TEST(CheckpointPlacement, SaveUnderOneShardingReadUnderAnother) {
  const auto layouts = synthetic_layouts();
  int checked = 0;
  for (const auto& a : layouts) {
    if (a.shape.size() > world_size()) continue;
    for (const auto& b : layouts) {
      if (b.shape.size() > world_size()) continue;
      const std::string what = a.name + " -> " + b.name;
      const std::string dir = shared_tmpdir("placement") + "/ckpt";
      {
        SubGroup sa(static_cast<int>(a.shape.size()));
        if (sa.member()) {
          checkpoint::Metadata meta;
          meta.step = 3;
          meta.mesh = a.shape;
          meta.world_size = a.shape.size();
          checkpoint::save_pieces(*sa.group, MeshLayout(a.shape), dir,
                                  synthetic_pieces(a, world_rank(), true), meta);
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      SubGroup sb(static_cast<int>(b.shape.size()));
      if (sb.member()) {
        auto pieces = synthetic_pieces(b, world_rank(), false);
        const checkpoint::Metadata meta = checkpoint::load_pieces(*sb.group, dir, pieces);
        EXPECT_EQ(meta.step, 3) << what;
        for (size_t i = 0; i < pieces.size(); ++i) {
          const auto& t = kSynthetic[i];
          at::Tensor expected =
              local_piece(global_value(t.shape, 100.0 * i).to(t.dtype), pieces[i].placement);
          EXPECT_TRUE(torch::equal(pieces[i].tensor, expected))
              << what << ": " << t.path << " " << pieces[i].placement.to_string() << " on rank "
              << world_rank();
        }
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CheckpointPlacement, ReplicasAreWrittenOnce) {
  if (world_size() < 4) GTEST_SKIP() << "needs 4 ranks (runs in checkpoint_test_np4)";
  const auto layouts = synthetic_layouts();
  const SyntheticLayout& layout = layouts[4];  // tp2 replicated over dp2
  const std::string dir = shared_tmpdir("replicas") + "/ckpt";
  {
    SubGroup s(4);
    checkpoint::save_pieces(*s.group, MeshLayout(layout.shape), dir,
                            synthetic_pieces(layout, world_rank(), true), checkpoint::Metadata{});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    // Ranks (dp, tp) = (0,0) -> 0 and (0,1) -> 1 write; 2 and 3 are replicas.
    EXPECT_TRUE(fs::exists(dir + "/shard-0.h5"));
    EXPECT_TRUE(fs::exists(dir + "/shard-1.h5"));
    EXPECT_FALSE(fs::exists(dir + "/shard-2.h5"));
    EXPECT_FALSE(fs::exists(dir + "/shard-3.h5"));
    const auto info = checkpoint::inspect(dir);
    EXPECT_EQ(info.writers, (std::vector<int64_t>{0, 1}));
    for (const auto& t : info.tensors) EXPECT_EQ(t.pieces, 2) << t.path;
    EXPECT_TRUE(checkpoint::verify(dir).empty());
  }
}

// ---- the engine: resharding matrix --------------------------------------------

struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> overrides;
};
// One row per strategy mix. zero/tp rows join here as their plugins land
// (e.g. {"zero1 x2", 2, {"parallel.zero.stage=1"}}).
const std::vector<Layout> kLayouts = {
    {"serial", 1, {}},
    {"dp2", 2, {}},
    {"dp4", 4, {}},
    {"zero1 x2", 2, {"parallel.zero.stage=1"}},
    {"zero2 x2", 2, {"parallel.zero.stage=2"}},
    {"zero3 x4", 4, {"parallel.zero.stage=3"}},
    {"tp1d x2", 2, {"parallel.tensor.size=2", "parallel.tensor.mode=1d"}},
    {"tp2d x4", 4, {"parallel.tensor.size=4", "parallel.tensor.mode=2d"}},
    {"tp1d x2 zero3 x2", 4,
     {"parallel.tensor.size=2", "parallel.tensor.mode=1d", "parallel.zero.stage=3"}},
};

constexpr int64_t kSaveAt = 4, kSteps = 8;

RunConfig matrix_config(const Layout& layout) {
  std::vector<std::string> o = layout.overrides;
  o.push_back("train.steps=" + std::to_string(kSteps));
  return testing::tiny_gpt_config(o);
}

std::unique_ptr<Engine> make_engine(const RunConfig& config, const comm::ProcessGroupPtr& group) {
  modules::register_builtin_models();
  return std::make_unique<Engine>(config, group,
                                  [](const RunConfig& c) { return data::make_source(c); });
}

// Every global tensor of the checkpoint state (parameters, optimizer states).
std::vector<at::Tensor> gathered_state(Engine& engine) {
  std::vector<at::Tensor> out;
  for (auto& p : engine.state().pieces) {
    out.push_back(gather_global(p.tensor.detach(), p.placement, engine.mesh()));
  }
  return out;
}

// A checkpoint into an engine, as `kolos train --resume` does it.
std::string load_into(Engine& engine, checkpoint::Checkpointer& ckpt, const std::string& path) {
  TrainingState state = engine.state();
  const std::string dir = ckpt.load(path, state);
  engine.load_state(state);
  return dir;
}

TEST(CheckpointMatrix, SaveUnderALoadUnderB) {
  std::vector<const Layout*> layouts;
  for (const auto& l : kLayouts) {
    if (l.ranks <= world_size()) layouts.push_back(&l);
  }
  // Each layout once: kSaveAt steps and a save (its global state kept), and
  // the uninterrupted run (its losses kept); then every pair loads.
  struct Saved {
    std::string root;
    std::vector<at::Tensor> state;
    std::vector<double> straight;
  };
  std::vector<Saved> saved(layouts.size());
  for (size_t k = 0; k < layouts.size(); ++k) {
    const Layout& a = *layouts[k];
    saved[k].root = shared_tmpdir("matrix");
    int64_t count = 0;
    SubGroup sa(a.ranks);
    if (sa.member()) {
      auto engine = make_engine(matrix_config(a), sa.group);
      for (int64_t s = 0; s < kSaveAt; ++s) engine->step();
      checkpoint::Checkpointer ckpt(sa.group, {saved[k].root, 0, false});
      ckpt.save(engine->state());
      saved[k].state = gathered_state(*engine);
      saved[k].straight = make_engine(matrix_config(a), sa.group)->train().losses;
    }
    count = static_cast<int64_t>(saved[k].state.size());
    MPI_Bcast(&count, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    saved[k].state = broadcast_from_0(saved[k].state, count);
  }
  int pairs = 0;
  for (size_t ka = 0; ka < layouts.size(); ++ka) {
    for (size_t kb = 0; kb < layouts.size(); ++kb) {
      const Layout& a = *layouts[ka];
      const Layout& b = *layouts[kb];
      const std::string what = "save under " + a.name + ", load under " + b.name;
      // B: load; every global tensor equal bit for bit; train on.
      SubGroup sb(b.ranks);
      if (sb.member()) {
        auto engine = make_engine(matrix_config(b), sb.group);
        checkpoint::Checkpointer ckpt(sb.group, {saved[ka].root, 0, false});
        load_into(*engine, ckpt, saved[ka].root);
        EXPECT_EQ(engine->steps_done(), kSaveAt) << what;
        EXPECT_EQ(engine->state().optimizer_steps, kSaveAt) << what;
        const auto loaded = gathered_state(*engine);
        const auto& expected = saved[ka].state;
        EXPECT_EQ(loaded.size(), expected.size()) << what;
        for (size_t i = 0; i < std::min(loaded.size(), expected.size()); ++i) {
          EXPECT_TRUE(torch::equal(loaded[i], expected[i])) << what << ": tensor " << i;
        }
        const std::vector<double> resumed = engine->train().losses;
        const std::vector<double>& straight = saved[kb].straight;
        // EXPECT, not ASSERT: every rank must reach the next pair's collectives.
        EXPECT_EQ(resumed.size(), static_cast<size_t>(kSteps - kSaveAt)) << what;
        for (size_t i = 0; i < resumed.size() && kSaveAt + i < straight.size(); ++i) {
          const double ref = straight[kSaveAt + i];
          if (a.name == b.name) {
            EXPECT_EQ(resumed[i], ref) << what << ": step " << kSaveAt + i + 1;
          } else {
            EXPECT_NEAR(resumed[i], ref, 1e-5 * std::abs(ref)) << what << ": step "
                                                               << kSaveAt + i + 1;
          }
        }
      }
      ++pairs;
    }
  }
  if (world_rank() == 0) {
    std::printf("[ checkpoint ] resharding matrix: %d pairs of layouts at %d ranks\n", pairs,
                world_size());
  }
}

// ---- resume bit-exact ---------------------------------------------------------------

void resume_bit_exact(bool async) {
  const std::string root = shared_tmpdir(async ? "resume-async" : "resume");
  const RunConfig config = testing::tiny_gpt_config({"train.steps=20"});
  auto straight = make_engine(config, testing::world_group());
  const std::vector<double> losses20 = straight->train().losses;
  const auto params20 = straight->gathered_parameters();

  std::vector<double> losses;
  {
    auto first = make_engine(config, testing::world_group());
    checkpoint::Checkpointer ckpt(testing::world_group(), {root, 2, async});
    for (int s = 0; s < 10; ++s) {
      losses.push_back(first->step().loss);
      if (s % 3 == 2) ckpt.save(first->state());  // steps 3, 6, 9: keep_last = 2 prunes step 3
    }
    ckpt.save(first->state());  // step 10
    ckpt.wait();
  }
  if (world_rank() == 0) {
    EXPECT_EQ(checkpoint::latest(root), root + "/step-00000010");
    EXPECT_FALSE(fs::exists(root + "/step-00000003"));
    EXPECT_FALSE(fs::exists(root + "/step-00000006"));
    EXPECT_TRUE(fs::exists(root + "/step-00000009"));
  }
  auto second = make_engine(config, testing::world_group());
  checkpoint::Checkpointer ckpt(testing::world_group(), {root, 2, async});
  EXPECT_EQ(load_into(*second, ckpt, root), root + "/step-00000010");
  for (double l : second->train().losses) losses.push_back(l);
  ASSERT_EQ(losses.size(), losses20.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i], losses20[i]) << "step " << i + 1 << (async ? " (async)" : "");
  }
  const auto params = second->gathered_parameters();
  ASSERT_EQ(params.size(), params20.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].second, params20[i].second)) << params[i].first;
  }
}

TEST(CheckpointResume, TenPlusTenEqualsTwentyBitForBit) { resume_bit_exact(false); }
TEST(CheckpointResume, AsynchronousSavesToo) { resume_bit_exact(true); }

// The state without storage: one engine's state applied to a fresh engine
// (copied into its own tensors) continues as the first one does.
TEST(TrainingStateTest, LoadStateCopiesAnotherEnginesState) {
  const RunConfig config = testing::tiny_gpt_config({"train.steps=8"});
  auto first = make_engine(config, testing::world_group());
  for (int s = 0; s < 4; ++s) first->step();
  const TrainingState state = first->state();
  EXPECT_EQ(state.step, 4);
  EXPECT_EQ(state.optimizer_steps, 4);
  EXPECT_EQ(state.data_position, 4 * config.train.global_batch);
  EXPECT_FALSE(state.rng_cpu.empty());
  auto second = make_engine(config, testing::world_group());
  second->load_state(state);
  EXPECT_EQ(second->steps_done(), 4);
  const auto a = first->gathered_parameters();
  const auto b = second->gathered_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
  EXPECT_EQ(first->step().loss, second->step().loss);
  // A piece this engine does not hold is refused by name.
  TrainingState foreign = second->state();
  foreign.pieces.push_back(
      StatePiece{"model/nowhere", torch::zeros({2}), Placement::replicated({2})});
  try {
    second->load_state(foreign);
    ADD_FAILURE() << "a foreign piece was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model/nowhere"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kolos
