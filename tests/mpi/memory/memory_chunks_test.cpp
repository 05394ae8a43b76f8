// The memory role's `chunks` plugin against the same run held in memory.
//
// A 4-block GPT whose states (parameters, gradients, AdamW m and v: about
// 0.8 MiB together) are several times the compute budget (256 KiB), so chunks
// must move between tiers every step. Every step's loss and gradient norm
// and every final parameter must be bit-equal to the in-memory run (the
// default dp plugin on one rank), for auto and static placement, host and
// NVMe lower tiers, a searched chunk size, with gradient accumulation,
// clipping, weight decay and full and selective recomputation.
// Checkpoints: saved from chunks on NVMe and loaded in memory, and the other
// way round, the resumed run equals the uninterrupted one. Bad input: each refusal names the key
// and the numbers. At 2 ranks: with data parallelism (every rank holding
// every chunk), the serial run's results within the harness's tolerance.
// bf16 and fp16 (masters in chunks of their own), an fp16 step skipped for
// overflow, and bf16 checkpoints both ways: bit-equal too. ZeRO-1 over
// chunks at 2 ranks: bit-equal to the in-memory dp run, checkpoints both ways.
// At 2, 4 and 8 ranks: with tensor and sequence parallelism, bit-equal to the
// same mix held in memory.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/engine.h"
#include "kolos/memory/chunk_layout.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

namespace fs = std::filesystem;
using testing::world_size;

constexpr int kSteps = 6;

// 4 blocks of hidden 32: about 0.2 MiB per kind of state, 0.8 MiB in all;
// 4 micro-batches per step; clipping at 0.5 (active on some steps: checked).
RunConfig config(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"model.layers=4", "optim.grad_clip=0.5",
                                       "train.steps=" + std::to_string(kSteps)});
  return testing::tiny_gpt_config(overrides);
}

std::vector<std::string> chunks(const std::string& placement, const std::string& offload,
                                const std::string& nvme_dir = "",
                                const std::string& chunk_size = "16KiB") {
  std::vector<std::string> o = {
      "memory.placement=\"" + placement + "\"", "memory.compute_budget=\"256KiB\"",
      "memory.offload=\"" + offload + "\"", "memory.chunk_size=\"" + chunk_size + "\""};
  if (!nvme_dir.empty()) o.push_back("memory.nvme_dir=\"" + nvme_dir + "\"");
  return o;
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// On this rank alone, or over every rank.
std::unique_ptr<Engine> make_engine(const RunConfig& config, bool world = false) {
  modules::register_builtin_models();
  return std::make_unique<Engine>(config, world ? testing::world_group() : testing::self_group(),
                                  [](const RunConfig& c) { return data::make_source(c); });
}

// After a multi-rank test: every store removed its own folder from the
// shared NVMe directory, which rank 0 then removes.
void expect_left_empty_and_remove(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (testing::world_rank() != 0) return;
  EXPECT_TRUE(fs::is_empty(dir)) << dir << " still holds files";
  fs::remove_all(dir);
}

// The 1-rank cases (bit-equal to the in-memory run on this rank) and the
// 2-rank ones (with dp) share the binary: each skips at the other count.
class Chunks : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_RANKS(1);
    nvme_ = testing::shared_tmpdir("chunks-nvme");
  }
  void TearDown() override {
    if (nvme_.empty()) return;
    // Each store removes its own folder: nothing is left behind.
    EXPECT_TRUE(fs::is_empty(nvme_)) << nvme_ << " still holds files";
    fs::remove_all(nvme_);
  }
  testing::RunRecord reference(const std::vector<std::string>& extra = {}) {
    const auto r = testing::serial_record(config(extra));
    EXPECT_LT(r.losses.back(), r.losses.front()) << "the reference must learn";
    // Clipping (at 0.5) must act on some step, or its path goes untested.
    EXPECT_GT(*std::max_element(r.grad_norms.begin(), r.grad_norms.end()), 0.5);
    return r;
  }
  testing::RunRecord candidate(const std::vector<std::string>& overrides) {
    return testing::run_and_record(config(overrides), testing::self_group());
  }
  std::string nvme_;
};

TEST_F(Chunks, AutoOnHostBitEqual) {
  testing::expect_records_bit_equal(reference(), candidate(chunks("auto", "host")), "auto, host");
}

TEST_F(Chunks, AutoOnNvmeBitEqual) {
  testing::expect_records_bit_equal(reference(), candidate(chunks("auto", "nvme", nvme_)),
                                    "auto, nvme");
}

TEST_F(Chunks, StaticOnNvmeBitEqual) {
  const auto o = plus(chunks("static", "nvme", nvme_),
                      {"memory.param_fraction=0.1", "memory.optim_fraction=0.05"});
  testing::expect_records_bit_equal(reference(), candidate(o), "static, nvme");
}

TEST_F(Chunks, SearchedChunkSizeAndRecomputeBitEqual) {
  for (const char* mode : {"full", "selective"}) {
    const std::vector<std::string> recompute = {"train.recompute=\"" + std::string(mode) + "\""};
    testing::expect_records_bit_equal(
        reference(recompute), candidate(plus(chunks("auto", "nvme", nvme_, "auto"), recompute)),
        std::string("searched chunk size, recompute ") + mode);
  }
}

TEST_F(Chunks, ResidentBytesStayWithinTheBudget) {
  auto engine = make_engine(config(chunks("auto", "nvme", nvme_)));
  for (int s = 0; s < 2; ++s) {
    const StepMetrics m = engine->step();
    // The compute tier's high point (split by kind at that point), counted
    // from the chunks resident after each trace step: within the budget,
    // and at least an optimizer step's four chunks of 16 KiB.
    EXPECT_LE(m.memory.total(), 256 * 1024);
    EXPECT_GE(m.memory.total(), 4 * 16 * 1024);
  }
}

// A checkpoint into an engine, as `kolos train --resume` does it.
void load_into(Engine& engine, const std::string& root) {
  checkpoint::Checkpointer ckpt(testing::self_group(), {root, 0, false});
  TrainingState state = engine.state();
  ckpt.load(root, state);
  engine.load_state(state);
}

void save_from(Engine& engine, const std::string& root) {
  checkpoint::Checkpointer ckpt(testing::self_group(), {root, 0, false});
  ckpt.save(engine.state());
}

// Half the steps under `a`, a checkpoint, the rest under `b` in a new engine:
// the same losses and parameters as kSteps straight in memory (each with
// `base` too).
void expect_resume_equal(const std::vector<std::string>& a, const std::vector<std::string>& b,
                         const std::string& what, const std::vector<std::string>& base = {}) {
  SCOPED_TRACE(what);
  const std::string root = testing::shared_tmpdir("chunks-ckpt");
  auto straight = make_engine(config(base));
  std::vector<double> expected;
  for (int s = 0; s < kSteps; ++s) expected.push_back(straight->step().loss);
  std::vector<double> losses;
  {
    auto first = make_engine(config(plus(base, a)));
    for (int s = 0; s < kSteps / 2; ++s) losses.push_back(first->step().loss);
    save_from(*first, root);
  }
  auto second = make_engine(config(plus(base, b)));
  load_into(*second, root);
  for (int s = kSteps / 2; s < kSteps; ++s) losses.push_back(second->step().loss);
  EXPECT_EQ(losses, expected);
  const auto want = straight->gathered_parameters();
  const auto got = second->gathered_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::equal(want[i].second, got[i].second)) << want[i].first;
  }
  fs::remove_all(root);
}

TEST_F(Chunks, CheckpointFromNvmeIntoMemoryAndBack) {
  expect_resume_equal(chunks("auto", "nvme", nvme_), {}, "nvme chunks -> memory");
  expect_resume_equal({}, chunks("static", "host"), "memory -> host chunks");
  expect_resume_equal(chunks("auto", "host"), chunks("auto", "nvme", nvme_),
                      "host chunks -> nvme chunks");
}

// ---- mixed precision ----------------------------------------------------------

// bf16 and fp16: parameters and gradients in chunks of the low dtype, the
// fp32 masters and moments in chunks of their own; AdamW steps the masters
// and rounds them into the parameters, as in memory.
TEST_F(Chunks, MixedPrecisionBitEqual) {
  for (const char* precision : {"bf16", "fp16"}) {
    const std::vector<std::string> p = {"train.precision=\"" + std::string(precision) + "\""};
    testing::expect_records_bit_equal(reference(p),
                                      candidate(plus(chunks("auto", "nvme", nvme_), p)),
                                      std::string(precision) + ", auto, nvme");
    testing::expect_records_bit_equal(
        reference(p),
        candidate(plus(plus(chunks("static", "host"), p), {"memory.optim_fraction=0.05"})),
        std::string(precision) + ", static, host");
  }
}

// fp16's loss scaler skips a step whose gradients overflowed: the chunks
// run the optimizer's part of their plan without updating, and the next
// steps equal the in-memory run's.
TEST_F(Chunks, Fp16OverflowSkipsTheStepAsInMemory) {
  const std::vector<std::string> p = {"train.precision=\"fp16\""};
  auto in_memory = make_engine(config(p));
  auto chunked = make_engine(config(plus(chunks("auto", "nvme", nvme_), p)));
  in_memory->inject_overflow_at_step(2);
  chunked->inject_overflow_at_step(2);
  for (int s = 0; s < kSteps; ++s) {
    const StepMetrics want = in_memory->step(), got = chunked->step();
    EXPECT_EQ(want.skipped, got.skipped) << "step " << s + 1;
    EXPECT_EQ(want.skipped, s == 2) << "step " << s + 1;
    EXPECT_EQ(want.loss, got.loss) << "step " << s + 1;
    EXPECT_EQ(want.grad_norm, got.grad_norm) << "step " << s + 1;
  }
  const auto want = in_memory->gathered_parameters(), got = chunked->gathered_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::equal(want[i].second, got[i].second)) << want[i].first;
  }
}

// A bf16 checkpoint holds the fp32 masters, from chunks or from memory.
TEST_F(Chunks, MixedPrecisionCheckpointBothWays) {
  const std::vector<std::string> bf16 = {"train.precision=\"bf16\""};
  expect_resume_equal(chunks("auto", "nvme", nvme_), {}, "bf16: nvme chunks -> memory", bf16);
  expect_resume_equal({}, chunks("static", "host"), "bf16: memory -> host chunks", bf16);
}

// ---- with data parallelism ----------------------------------------------------

// Every rank holds every chunk (on NVMe here, a folder per rank) and the
// gradients are averaged over dp as backward makes them final: the serial
// run's losses, norms and parameters within the harness's tolerance.
TEST(ChunksWithDp, MatchesTheSerialRun) {
  REQUIRE_RANKS(2);
  const std::string nvme = testing::shared_tmpdir("chunks-dp");
  testing::expect_equivalent(config({}),
                             config(plus(chunks("auto", "nvme", nvme), {"parallel.data=2"})));
  testing::expect_equivalent(
      config({}),
      config(plus(chunks("static", "host"), {"parallel.data=2", "memory.param_fraction=0.1"})));
  expect_left_empty_and_remove(nvme);
}

// With data parallelism a gradient's reduction runs while the next block
// step computes (its chunk stays resident there), where the budget has room:
// the step's metrics report those bytes as launched during backward, and
// the reductions done before finish_backward.
TEST(ChunksWithDp, ReductionsOverlapTheNextBlockStep) {
  REQUIRE_RANKS(2);
  for (const char* stage : {"0", "2"}) {
    auto e =
        make_engine(config(plus(chunks("auto", "host"),
                                {"parallel.data=2", std::string("parallel.zero.stage=") + stage})),
                    true);
    const StepMetrics m = e->step();
    EXPECT_GT(m.reduction.reductions, 0) << "stage " << stage;
    EXPECT_GT(m.reduction.bytes_during_backward, 0) << "stage " << stage;
    EXPECT_LT(m.reduction.bytes_during_backward, m.reduction.bytes) << "stage " << stage;
    EXPECT_GT(m.reduction.completed_before_finish, 0) << "stage " << stage;
    EXPECT_LE(m.reduction.completed_before_finish, m.reduction.reductions) << "stage " << stage;
  }
}

// ZeRO-3: a block step's parameter chunks are gathered from their owners
// while the step before computes (they are in its trace step too), where
// the budget has room: all but the first step's gathers are launched ahead.
// A budget without that room gathers each where its step begins, with the
// same results (ChunksWithZero23.BitEqualToDpInMemory covers both).
TEST(ChunksWithZero23, GathersRunAheadOfTheirStep) {
  REQUIRE_RANKS(2);
  for (const char* budget : {"256KiB", "2MiB"}) {
    auto e = make_engine(config(plus(chunks("auto", "host"),
                                     {"parallel.data=2", "parallel.zero.stage=3",
                                      std::string("memory.compute_budget=\"") + budget + "\""})),
                         true);
    for (int s = 0; s < 2; ++s) {
      const StepMetrics m = e->step();
      EXPECT_GT(m.gather.bytes, 0) << budget;
      EXPECT_GT(m.gather.bytes_ahead, 0) << budget;
      EXPECT_LT(m.gather.bytes_ahead, m.gather.bytes) << budget << ": step 0's cannot be ahead";
      EXPECT_LE(m.gather.wait_s, m.step_time_s);  // timed inside the step
    }
  }
}

// ---- ZeRO-1 over chunks --------------------------------------------------------

// parallel.zero.stage = 1: each dp rank holds and steps the optimizer chunks
// (moments and, under bf16, masters) of every other chunk index, then
// broadcasts that chunk's parameters: the in-memory dp run, bit for bit.
TEST(ChunksWithZero1, BitEqualToDpInMemory) {
  REQUIRE_RANKS(2);
  const std::string nvme = testing::shared_tmpdir("chunks-zero1");
  for (const char* precision : {"fp32", "bf16"}) {
    const std::vector<std::string> dp = {"parallel.data=2",
                                         "train.precision=\"" + std::string(precision) + "\""};
    const auto in_memory = testing::run_and_record(config(dp), testing::world_group());
    testing::expect_records_bit_equal(
        in_memory,
        testing::run_and_record(
            config(plus(plus(chunks("auto", "nvme", nvme), dp), {"parallel.zero.stage=1"})),
            testing::world_group()),
        std::string(precision) + ", zero1, auto, nvme");
    testing::expect_records_bit_equal(
        in_memory,
        testing::run_and_record(
            config(plus(plus(chunks("static", "host"), dp),
                        {"parallel.zero.stage=1", "memory.optim_fraction=0.1"})),
            testing::world_group()),
        std::string(precision) + ", zero1, static, host");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (testing::world_rank() == 0) fs::remove_all(nvme);
}

// ZeRO-2: each gradient is averaged onto its chunk's owner only, and the
// others drop their copy of a gradient chunk once it is reduced; ZeRO-3:
// each parameter chunk stays on its owner, the others gather it where a
// block needs it. The in-memory dp run, bit for bit (two ranks: the
// reductions add the same two numbers).
TEST(ChunksWithZero23, BitEqualToDpInMemory) {
  REQUIRE_RANKS(2);
  const std::string nvme = testing::shared_tmpdir("chunks-zero23");
  for (const char* precision : {"fp32", "bf16"}) {
    const std::vector<std::string> dp = {"parallel.data=2",
                                         "train.precision=\"" + std::string(precision) + "\""};
    const auto in_memory = testing::run_and_record(config(dp), testing::world_group());
    for (const char* stage : {"2", "3"}) {
      const std::string zero = std::string("parallel.zero.stage=") + stage;
      testing::expect_records_bit_equal(
          in_memory,
          testing::run_and_record(config(plus(plus(chunks("auto", "nvme", nvme), dp), {zero})),
                                  testing::world_group()),
          std::string(precision) + ", zero" + stage + ", auto, nvme");
      testing::expect_records_bit_equal(
          in_memory,
          testing::run_and_record(
              config(plus(plus(chunks("static", "host"), dp), {zero, "memory.param_fraction=0.2"})),
              testing::world_group()),
          std::string(precision) + ", zero" + stage + ", static, host");
    }
  }
  expect_left_empty_and_remove(nvme);
}

// The bytes of the files this rank's NVMe store made for a run of
// `stage` at dp 2 with micro-batches of `micro_batch` sequences (8: one per
// step), measured on disk after a step while the run lives; and the chunks
// per kind of state its layout has (every kind has as many).
struct OnDisk {
  int64_t bytes = 0;
  int64_t chunks_per_kind = 0;
};
OnDisk bytes_on_disk(const std::string& stage, const std::string& micro_batch) {
  const std::string dir =
      testing::shared_tmpdir("chunks-zero-disk") + "/rank" + std::to_string(testing::world_rank());
  fs::create_directories(dir);
  auto e = make_engine(
      config(plus(chunks("auto", "nvme", dir), {"parallel.data=2", "parallel.zero.stage=" + stage,
                                                "train.micro_batch=" + micro_batch})),
      true);
  e->step();
  OnDisk out;
  for (const auto& f : fs::recursive_directory_iterator(dir)) {
    if (f.is_regular_file()) out.bytes += static_cast<int64_t>(f.file_size());
  }
  std::vector<memory::TensorSpec> specs;
  for (const auto& p : e->model().placed_parameters()) {
    if (p.tensor.requires_grad()) specs.push_back({p.name, p.tensor.numel() * 4});
  }
  out.chunks_per_kind = static_cast<int64_t>(memory::pack(specs, 16 * 1024).num_chunks());
  e.reset();
  fs::remove_all(dir);
  return out;
}

// ZeRO over chunks shards what the tier holds (fp32 at 2 ranks, 16 KiB
// chunks, which are the NVMe slots' size; chunk k is rank k mod 2's). With
// one micro-batch per step a gradient chunk of another rank's index stays
// resident from its first use to its reduction (its bytes are dead after),
// so it takes no slot: under ZeRO-1 and ZeRO-2 a rank's files hold every
// parameter chunk and at most its own indices' gradient, exp_avg and
// exp_avg_sq chunks; ZeRO-3 also only its own parameter chunks. One chunk
// more is allowed: the tied embedding's gradient chunk (chunk 0, rank 0's)
// lives from the head's backward to the embedding's, and the budget may
// evict it in between on rank 1. With two micro-batches per step the
// budget evicts gradient chunks between them, so some of another rank's
// take slots again.
TEST(ChunksWithZero23, EachRankKeepsItsOwnShareOnNvme) {
  REQUIRE_RANKS(2);
  const int64_t slot = 16 * 1024;
  const OnDisk zero1 = bytes_on_disk("1", "8");
  const OnDisk zero2 = bytes_on_disk("2", "8");
  const OnDisk zero3 = bytes_on_disk("3", "8");
  const OnDisk zero2_accumulating = bytes_on_disk("2", "4");
  const int64_t n = zero2.chunks_per_kind;
  const int64_t own = (n + 1 - testing::world_rank()) / 2;
  const int64_t tied = testing::world_rank() == 0 ? 0 : 1;
  ASSERT_GT(n, 4);
  const auto in_slots = [&](const OnDisk& d) { return d.bytes / slot; };
  const std::string where = "rank " + std::to_string(testing::world_rank()) + ": " +
                            std::to_string(n) + " chunks per kind, " + std::to_string(own) +
                            " this rank's; slots under ZeRO-1 " + std::to_string(in_slots(zero1)) +
                            ", ZeRO-2 " + std::to_string(in_slots(zero2)) + ", ZeRO-3 " +
                            std::to_string(in_slots(zero3)) + ", ZeRO-2 with two micro-batches " +
                            std::to_string(in_slots(zero2_accumulating));
  for (const OnDisk* d : {&zero1, &zero2, &zero3, &zero2_accumulating}) {
    EXPECT_EQ(d->bytes % slot, 0) << where;
  }
  // Parameters, and the moments of its own indices, at least; its own
  // gradients at most.
  EXPECT_GE(in_slots(zero1), n + 2 * own) << where;
  EXPECT_LE(in_slots(zero1), n + 3 * own + tied) << where;
  EXPECT_GE(in_slots(zero2), n + 2 * own) << where;
  EXPECT_LE(in_slots(zero2), n + 3 * own + tied) << where;
  EXPECT_GE(in_slots(zero3), 3 * own) << where;
  EXPECT_LE(in_slots(zero3), 4 * own + tied) << where;
  // Accumulating over micro-batches, another rank's gradient chunks leave
  // the compute tier with live bytes: more slots than its share.
  EXPECT_GT(in_slots(zero2_accumulating), n + 3 * own + tied) << where;
  expect_left_empty_and_remove(testing::shared_tmpdir("chunks-zero-disk"));
}

// A checkpoint of ZeRO chunks holds every rank's optimizer (and ZeRO-3's
// parameter) chunks: it resumes in memory, and a checkpoint from memory
// resumes in ZeRO chunks, with the losses and parameters of the
// uninterrupted run.
TEST(ChunksWithZero, CheckpointBothWays) {
  REQUIRE_RANKS(2);
  const std::vector<std::string> dp = {"parallel.data=2", "train.precision=\"bf16\""};
  for (const char* stage : {"1", "3"}) {
    const auto zero1 =
        plus(plus(chunks("auto", "host"), dp), {std::string("parallel.zero.stage=") + stage});
    auto engine = [](const std::vector<std::string>& o) {
      modules::register_builtin_models();
      return std::make_unique<Engine>(config(o), testing::world_group(),
                                      [](const RunConfig& c) { return data::make_source(c); });
    };
    auto straight = engine(dp);
    std::vector<double> expected;
    for (int s = 0; s < kSteps; ++s) expected.push_back(straight->step().loss);
    const auto want = straight->gathered_parameters();
    for (const auto& [a, b] :
         std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>>{{zero1, dp},
                                                                                    {dp, zero1}}) {
      const std::string root = testing::shared_tmpdir("chunks-zero1-ckpt");
      std::vector<double> losses;
      {
        auto first = engine(a);
        for (int s = 0; s < kSteps / 2; ++s) losses.push_back(first->step().loss);
        checkpoint::Checkpointer(testing::world_group(), {root, 0, false}).save(first->state());
      }
      auto second = engine(b);
      TrainingState state = second->state();
      checkpoint::Checkpointer(testing::world_group(), {root, 0, false}).load(root, state);
      second->load_state(state);
      for (int s = kSteps / 2; s < kSteps; ++s) losses.push_back(second->step().loss);
      EXPECT_EQ(losses, expected) << (a == zero1 ? "zero chunks -> memory"
                                                 : "memory -> zero chunks")
                                  << ", stage " << stage;
      const auto got = second->gathered_parameters();
      ASSERT_EQ(want.size(), got.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(torch::equal(want[i].second, got[i].second)) << want[i].first;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (testing::world_rank() == 0) fs::remove_all(root);
    }
  }
}

// ---- with tensor, sequence and pipeline parallelism ----------------------------

// The chunks hold this rank's pieces of the mix; its tensor- and
// sequence-parallel collectives run inside the blocks as they do in memory,
// gradients are averaged over dp x sp, and the norm sums sharded pieces over
// their groups: the same mix held in memory (the default dp plugin), bit for
// bit. At 2 ranks: tensor 1d, Megatron, Ulysses and ring sequence
// parallelism, the pipeline's 1F1B, GPipe and interleaved schedules (the
// chunks follow the schedule's passes; tied weights' copies are summed by
// the pipeline while their gradient chunks are resident); at 4: tensor 2d,
// hybrid sequence parallelism, dp x tp, dp x pp under ZeRO-1 and tp x pp;
// at 8: tensor 2.5d and 3d.
// `chunks_only`: overrides of the chunked runs alone (parallel.zero.stage =
// 1 shards the chunks; the reference is the dp plugin's run). Each mix runs
// chunked twice, under auto placement on NVMe and static placement on the
// host tier, or (`placements`) under one of them.
enum class Placements { kBoth, kAutoNvme, kStaticHost };
void expect_mixes_bit_equal(const std::vector<std::vector<std::string>>& mixes,
                            const std::vector<std::string>& chunks_only = {},
                            Placements placements = Placements::kBoth) {
  const std::string nvme = testing::shared_tmpdir("chunks-mix");
  for (const auto& mix : mixes) {
    std::string label;
    for (const auto& o : mix) label += o + " ";
    for (const auto& o : chunks_only) label += "chunks: " + o + " ";
    const auto in_memory = testing::run_and_record(config(mix), testing::world_group());
    EXPECT_LT(in_memory.losses.back(), in_memory.losses.front()) << label;
    if (placements != Placements::kStaticHost) {
      testing::expect_records_bit_equal(
          in_memory,
          testing::run_and_record(
              config(plus(plus(chunks("auto", "nvme", nvme), mix), chunks_only)),
              testing::world_group()),
          label + "(auto, nvme)");
    }
    if (placements != Placements::kAutoNvme) {
      testing::expect_records_bit_equal(
          in_memory,
          testing::run_and_record(config(plus(plus(plus(chunks("static", "host"), mix), chunks_only),
                                              {"memory.param_fraction=0.1"})),
                                  testing::world_group()),
          label + "(static, host)");
    }
  }
  expect_left_empty_and_remove(nvme);
}

TEST(ChunksInParallelMixes, BitEqualToTheMixInMemoryAt2) {
  REQUIRE_RANKS(2);
  expect_mixes_bit_equal({
      {"parallel.tensor.size=2"},
      {"parallel.tensor.size=2", "parallel.sequence.mode=\"megatron\""},
      {"parallel.sequence.size=2", "parallel.sequence.mode=\"ulysses\""},
      {"parallel.sequence.size=2", "parallel.sequence.mode=\"ring\""},
      {"parallel.data=2", "train.precision=\"bf16\""},
      {"parallel.tensor.size=2", "train.precision=\"fp16\""},
      {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"1f1b\""},
      {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"gpipe\"",
       "train.recompute=\"full\""},
      {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"interleaved\"",
       "parallel.pipeline.chunks=2", "model.layers=6", "train.precision=\"bf16\""},
      {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"zb\""},
      {"parallel.pipeline.size=2", "parallel.pipeline.schedule=\"zb\"", "train.precision=\"fp16\"",
       "train.recompute=\"full\""},
  });
}

TEST(ChunksInParallelMixes, BitEqualToTheMixInMemoryAt4) {
  REQUIRE_RANKS(4);
  expect_mixes_bit_equal({
      {"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""},
      {"parallel.sequence.size=4", "parallel.sequence.mode=\"hybrid\"",
       "parallel.sequence.ulysses=2"},
      {"parallel.data=2", "parallel.tensor.size=2"},
      {"parallel.tensor.size=2", "parallel.pipeline.size=2", "train.precision=\"fp16\""},
  });
  expect_mixes_bit_equal({{"parallel.data=2", "parallel.pipeline.size=2"}},
                         {"parallel.zero.stage=1"});
  // ZeRO-3 under the pipeline (tied weights summed over stages while each
  // dp rank owns other chunks), ZeRO-2 with tensor parallelism in bf16.
  expect_mixes_bit_equal(
      {{"parallel.data=2", "parallel.pipeline.size=2"},
       {"parallel.data=2", "parallel.pipeline.size=2", "parallel.pipeline.schedule=\"zb\""}},
      {"parallel.zero.stage=3"});
  expect_mixes_bit_equal(
      {{"parallel.data=2", "parallel.tensor.size=2", "train.precision=\"bf16\""}},
      {"parallel.zero.stage=2"});
}

// Four data-parallel ranks under ZeRO-3 over chunks (each rank owning every
// fourth chunk): the serial run within the harness's tolerance (four
// addends: the reductions' order is MPI's).
TEST(ChunksWithZero23, MatchesTheSerialRunAt4) {
  REQUIRE_RANKS(4);
  testing::expect_equivalent(
      config({}),
      config(plus(chunks("auto", "host"), {"parallel.data=4", "parallel.zero.stage=3"})));
  testing::expect_equivalent(
      config({}), config(plus(chunks("static", "host"), {"parallel.data=4", "parallel.zero.stage=2",
                                                         "memory.grad_fraction=0.2"})));
}

// Eight ranks on a small machine are slow to run: each grid under one
// placement (the placements do not depend on the tensor mode; both run
// under every mode above).
TEST(ChunksInParallelMixes, BitEqualToTheMixInMemoryAt8) {
  REQUIRE_RANKS(8);
  expect_mixes_bit_equal(
      {{"parallel.tensor.size=8", "parallel.tensor.mode=\"2.5d\"", "parallel.tensor.depth=2"}}, {},
      Placements::kAutoNvme);
  expect_mixes_bit_equal({{"parallel.tensor.size=8", "parallel.tensor.mode=\"3d\""}}, {},
                         Placements::kStaticHost);
}

// ---- bad input ---------------------------------------------------------------

// The message of the error an engine for `overrides` raises ("" if none).
std::string engine_error(const std::vector<std::string>& overrides) {
  try {
    make_engine(config(overrides));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ChunksBadInput, RefusedWithTheNumbers) {
  REQUIRE_RANKS(1);
  // A budget below the widest step's working set: both numbers named.
  auto small = chunks("auto", "host");
  small[1] = "memory.compute_budget=\"64KiB\"";
  std::string e = engine_error(small);
  EXPECT_NE(e.find("memory.compute_budget"), std::string::npos) << e;
  EXPECT_NE(e.find("65536"), std::string::npos) << e;
  // A chunk smaller than the largest tensor (the 32 x 128 MLP weights).
  e = engine_error(chunks("auto", "host", "", "8KiB"));
  EXPECT_NE(e.find("memory.chunk_size"), std::string::npos) << e;
  EXPECT_NE(e.find("mlp"), std::string::npos) << e;
  // A chunk size that is not a multiple of the direct-I/O alignment.
  e = testing::config_error(plus(chunks("auto", "host", "", "10000B"), {"model.layers=4"}));
  EXPECT_NE(e.find("memory.chunk_size"), std::string::npos) << e;
  EXPECT_NE(e.find("4096"), std::string::npos) << e;
  // An nvme_dir that is missing, or one the process cannot create a folder in.
  e = testing::config_error(chunks("auto", "nvme", "/nonexistent/kolos-nvme"));
  EXPECT_NE(e.find("memory.nvme_dir"), std::string::npos) << e;
  EXPECT_NE(e.find("/nonexistent/kolos-nvme"), std::string::npos) << e;
  e = engine_error(chunks("auto", "nvme", "/proc"));
  EXPECT_NE(e.find("/proc"), std::string::npos) << e;
  // nvme without a directory; keys of the other policy or tier.
  e = testing::config_error(chunks("auto", "nvme"));
  EXPECT_NE(e.find("memory.nvme_dir"), std::string::npos) << e;
  e = testing::config_error(plus(chunks("auto", "host"), {"memory.param_fraction=0.5"}));
  EXPECT_NE(e.find("static"), std::string::npos) << e;
  e = testing::config_error(plus(chunks("static", "host"), {"memory.prefetch=2"}));
  EXPECT_NE(e.find("auto"), std::string::npos) << e;
  e = testing::config_error(plus(chunks("auto", "host"), {"memory.io_threads=2"}));
  EXPECT_NE(e.find("nvme"), std::string::npos) << e;
  e = testing::config_error({"memory.placement=\"auto\""});
  EXPECT_NE(e.find("compute_budget"), std::string::npos) << e;
  e = testing::config_error(plus(chunks("auto", "host"), {"memory.unknown=1"}));
  EXPECT_NE(e.find("memory.unknown"), std::string::npos) << e;
  // Mixes this version does not run.
  e = testing::config_error(plus(chunks("auto", "host"), {"plugins.gradients=\"zero1\""}));
  EXPECT_NE(e.find("plugins.gradients"), std::string::npos) << e;
}

}  // namespace
}  // namespace kolos
