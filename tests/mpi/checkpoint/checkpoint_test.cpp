// Checkpoints across meshes, as real MPI runs (np 1, 2, 4, 8).
//
// - Placement level: tensors sharded over tp and dp with uneven, padded and
//   empty shards are saved under one layout and read back under others; the
//   hyperslab/VDS logic is tested without any strategy plugin.
// - The resharding matrix: save under layout A, load under layout B, for
//   every row of kLayouts that fits the world with itself and to and from
//   serial: every global tensor (parameters and optimizer states) equal bit
//   for bit after load, and training on under B gives the losses of an
//   uninterrupted run under B (exactly when A == B). A new strategy is one
//   row.
// - Every other layout the engine accepts (sequence modes, pipeline
//   schedules, tp2.5d and tp3d at 8 ranks) to and from serial.
// - Resume: 20 steps straight vs 10, save, a new engine, load, 10 more:
//   identical losses and final parameters, synchronous and asynchronous.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

// 8 ranks run only the layouts that need them (CheckpointLayouts); every
// other test runs at 1, 2 and 4.
#define SKIP_AT_EIGHT() \
  if (world_size() > 4) GTEST_SKIP() << "runs at 1, 2 and 4 ranks"

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
  SKIP_AT_EIGHT();
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
  SKIP_AT_EIGHT();
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
  SKIP_AT_EIGHT();
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
  // Each layout with itself (a resume equal bit for bit) and to and from
  // serial (every global tensor equal bit for bit), as below: every load
  // goes through the global tensors, so these cover any pair. Each pair at
  // the smallest world size of the suite's (1, 2, 4) that holds both
  // layouts: a pair of layouts of at most half this world's ranks ran in
  // the run at that size already.
  int pairs = 0;
  for (size_t ka = 0; ka < layouts.size(); ++ka) {
    for (size_t kb = 0; kb < layouts.size(); ++kb) {
      const Layout& a = *layouts[ka];
      const Layout& b = *layouts[kb];
      if (2 * std::max(a.ranks, b.ranks) <= world_size()) continue;
      if (ka != kb && a.ranks > 1 && b.ranks > 1) continue;
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

// ---- every other layout the engine accepts, to and from serial ----------------------
//
// The sequence modes, the pipeline schedules and the 8-rank tensor modes,
// each at exactly its own world size (2, 4 or 8 ranks), against the serial
// layout both ways: a save under serial loads under the layout, and a save
// under the layout loads serially. Since every load goes through the global
// tensors, to-and-from serial covers any pair. After each load the state is
// saved again at once and the model's global weights of the two saves
// compared bit for bit (read from the files: pipeline stages hold
// different tensors, so there is no common set to gather); training on
// gives the losses of the uninterrupted run under the loading layout
// (1e-5 relative: the saving layout summed in another order), which also
// checks the optimizer's states.
const std::vector<Layout> kMoreLayouts = {
    {"ulysses x2", 2, {"parallel.sequence.size=2", "parallel.sequence.mode=\"ulysses\""}},
    {"ring x2", 2, {"parallel.sequence.size=2", "parallel.sequence.mode=\"ring\""}},
    {"megatron x2", 2,
     {"parallel.tensor.size=2", "parallel.tensor.mode=\"1d\"", "parallel.sequence.mode=\"megatron\""}},
    {"1f1b x2", 2, {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""}},
    {"zb x2", 2, {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"zb\""}},
    {"interleaved x2", 2,
     {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"interleaved\"",
      "parallel.pipeline.chunks=2"}},
    {"hybrid 2x2", 4,
     {"parallel.sequence.size=4", "parallel.sequence.mode=\"hybrid\"", "parallel.sequence.ulysses=2"}},
    {"1f1b x2 tp1d x2", 4,
     {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\"", "parallel.tensor.size=2",
      "parallel.tensor.mode=\"1d\""}},
    {"tp2.5d x8", 8,
     {"parallel.tensor.size=8", "parallel.tensor.mode=\"2.5d\"", "parallel.tensor.depth=2"}},
    {"tp3d x8", 8, {"parallel.tensor.size=8", "parallel.tensor.mode=\"3d\""}},
};

RunConfig layout_config(std::vector<std::string> overrides) {
  overrides.push_back("model.layers=2");  // 4 blocks: interleaved's 2 stages x 2 chunks
  overrides.push_back("train.steps=" + std::to_string(kSteps));
  return testing::tiny_gpt_config(overrides);
}

// kSaveAt steps under `config` on `group`, saved into a new root; then the
// uninterrupted run's losses.
struct SavedRun {
  std::string root;
  std::vector<double> straight;
};
SavedRun save_at_four(const RunConfig& config, const comm::ProcessGroupPtr& group,
                      const std::string& name) {
  SavedRun run{shared_tmpdir(name), {}};
  if (group == nullptr) return run;
  auto engine = make_engine(config, group);
  for (int64_t s = 0; s < kSaveAt; ++s) engine->step();
  checkpoint::Checkpointer ckpt(group, {run.root, 0, false});
  ckpt.save(engine->state());
  run.straight = make_engine(config, group)->train().losses;
  return run;
}

// `saved` loaded under `config` on `group`, saved again at once into a new
// root (returned), then trained on against `straight`.
std::string load_save_train(const RunConfig& config, const comm::ProcessGroupPtr& group,
                            const std::string& saved, const std::vector<double>& straight,
                            const std::string& what) {
  const std::string again = shared_tmpdir("again");
  if (group == nullptr) return again;
  auto engine = make_engine(config, group);
  checkpoint::Checkpointer load(group, {saved, 0, false});
  load_into(*engine, load, saved);
  EXPECT_EQ(engine->steps_done(), kSaveAt) << what;
  checkpoint::Checkpointer save(group, {again, 0, false});
  save.save(engine->state());
  const std::vector<double> resumed = engine->train().losses;
  EXPECT_EQ(resumed.size(), static_cast<size_t>(kSteps - kSaveAt)) << what;
  for (size_t i = 0; i < resumed.size() && kSaveAt + i < straight.size(); ++i) {
    const double ref = straight[kSaveAt + i];
    EXPECT_NEAR(resumed[i], ref, 1e-5 * std::abs(ref)) << what << ": step " << kSaveAt + i + 1;
  }
  return again;
}

// By name: a layout saves its tensors in its own order (interleaved stages).
void expect_same_weights(const std::string& a, const std::string& b, const std::string& what) {
  std::map<std::string, at::Tensor> wa, wb;
  for (auto& [name, t] : checkpoint::read_model_weights(a).tensors) wa[name] = t;
  for (auto& [name, t] : checkpoint::read_model_weights(b).tensors) wb[name] = t;
  ASSERT_EQ(wa.size(), wb.size()) << what;
  for (const auto& [name, t] : wa) {
    ASSERT_EQ(wb.count(name), 1u) << what << ": " << name << " missing";
    EXPECT_TRUE(torch::equal(t, wb[name])) << what << ": " << name;
  }
}

TEST(CheckpointLayouts, EveryLayoutToAndFromSerial) {
  int tried = 0;
  for (const Layout& layout : kMoreLayouts) {
    if (layout.ranks != world_size()) continue;
    ++tried;
    const RunConfig serial = layout_config({"parallel.data=1"});
    const RunConfig mine = layout_config(layout.overrides);
    SubGroup one(1);
    const SavedRun s = save_at_four(serial, one.group, "serial");
    const SavedRun l = save_at_four(mine, testing::world_group(), "layout");
    const std::string s_under_l = load_save_train(mine, testing::world_group(), s.root, l.straight,
                                                  "save serial, load under " + layout.name);
    const std::string l_under_s = load_save_train(serial, one.group, l.root, s.straight,
                                                  "save under " + layout.name + ", load serial");
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      expect_same_weights(s.root + "/step-00000004", s_under_l + "/step-00000004",
                          "serial's save, saved again under " + layout.name);
      expect_same_weights(l.root + "/step-00000004", l_under_s + "/step-00000004",
                          layout.name + "'s save, saved again serially");
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (tried == 0) GTEST_SKIP() << "no layout of " << world_size() << " ranks";
  if (world_rank() == 0) {
    std::printf("[ checkpoint ] %d layout(s) of %d ranks to and from serial\n", tried,
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

TEST(CheckpointResume, TenPlusTenEqualsTwentyBitForBit) {
  SKIP_AT_EIGHT();
  resume_bit_exact(false);
}
TEST(CheckpointResume, AsynchronousSavesToo) {
  SKIP_AT_EIGHT();
  resume_bit_exact(true);
}

// The state without storage: one engine's state applied to a fresh engine
// (copied into its own tensors) continues as the first one does.
TEST(TrainingStateTest, LoadStateCopiesAnotherEnginesState) {
  SKIP_AT_EIGHT();
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
