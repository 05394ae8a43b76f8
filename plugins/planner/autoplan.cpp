// The planner role's plugin `autoplan` (kolos/core/planner.h): libkolos_planner's
// cost model and search, fed by this machine's calibration or a cluster
// file, with kolos's own checks as the last word on every plan it offers.
//
// [planner] keys: cluster (a cluster file: plan for those machines),
// calibration (a calibration file to use instead of this host's cache),
// top (plans kept, default 10), tune (finalists tried before training:
// the best K predictions and every plan within the margin, default 3; 0:
// none), tune_steps (steps per finalist, default 5), tune_seconds (the
// tuning's time bound, default 45).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "kolos/core/config_located.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/memory_estimate.h"
#include "kolos/core/planner.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/roles.h"
#include "kolos/core/runtime.h"
#include "kolos/core/sequence.h"
#include "kolos/planner/search.h"
#include "kolos/planner/tune.h"

namespace kolos {
namespace {

namespace pl = kolos::planner;
namespace fs = std::filesystem;

struct Settings {
  std::string cluster, calibration;
  int64_t top = 10;
  int64_t tune = 3;
  TuneSettings trials;
};

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name[0] ? name : "localhost";
}

std::string cache_dir() {
  if (const char* d = std::getenv("KOLOS_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/kolos";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/kolos";
  return ".kolos-cache";
}

// Whether the config sets `key` ("parallel.tensor.size") itself, in its file
// or by --set; `tensor = 4` sets parallel.tensor.size.
bool given(const RunConfig& config, const std::string& table, const std::string& key,
           bool shorthand = false) {
  if (config.section(table).has(key)) return true;
  if (!shorthand) return false;
  const auto dot = table.rfind('.');
  return !config.section(table).present() &&
         config.section(table.substr(0, dot)).has(table.substr(dot + 1));
}

pl::Workload workload_of(const RunConfig& config) {
  const ModelConfig& m = config.model;
  if (m.name != "gpt") {
    throw ConfigError(located(config, "model.name",
                              "model.name = \"" + m.name +
                                  "\": the planner's cost model describes GPT only "
                                  "(model.name = \"gpt\"); plan this model by hand"));
  }
  pl::Workload w;
  w.model.name = m.name;
  w.model.layers = m.layers;
  w.model.hidden = m.hidden;
  w.model.heads = m.heads;
  w.model.seq_len = m.seq_len;
  w.model.vocab = m.vocab;
  w.model.ffn_multiplier = m.mlp_ratio;
  w.global_batch = config.train.global_batch;
  w.precision = config.train.precision;
  return w;
}

pl::Fixed fixed_of(const RunConfig& c) {
  pl::Fixed f;
  const auto& p = c.parallel;
  if (given(c, "parallel", "data") && p.data > 0) f.dp = p.data;
  if (given(c, "parallel.tensor", "size", true)) f.tp = p.tensor.size;
  if (given(c, "parallel.tensor", "mode")) f.tp_mode = p.tensor.mode;
  if (given(c, "parallel.pipeline", "size", true)) f.pp = p.pipeline.size;
  if (given(c, "parallel.pipeline", "schedule")) {
    std::string s;
    c.section("parallel.pipeline").read("schedule", s);
    f.schedule = s;
  }
  if (given(c, "parallel.sequence", "size", true)) f.sp = p.sequence.size;
  if (given(c, "parallel.sequence", "mode")) f.sp_mode = p.sequence.mode;
  if (given(c, "parallel.zero", "stage", true)) f.zero = p.zero.stage;
  if (given(c, "train", "micro_batch")) f.micro_batch = c.train.micro_batch;
  if (given(c, "train", "recompute")) f.recompute = c.train.recompute;
  return f;
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// The --set lines that turn a config into the run of candidate `c`.
std::vector<std::string> overrides_of(const pl::Candidate& c) {
  std::vector<std::string> o = {
      "parallel.auto=false",
      "parallel.data=" + std::to_string(c.dp),
      "parallel.tensor.size=" + std::to_string(c.tp),
      "parallel.pipeline.size=" + std::to_string(c.pp),
      "parallel.zero.stage=" + std::to_string(c.zero),
      "train.micro_batch=" + std::to_string(c.micro_batch),
      std::string("train.recompute=") + quoted(pl::to_string(c.recompute))};
  if (c.tp > 1) {
    o.push_back(std::string("parallel.tensor.mode=") + quoted(pl::to_string(c.tp_mode)));
    if (c.tp_mode == pl::TpMode::k2p5D) {
      o.push_back("parallel.tensor.depth=" + std::to_string(c.tp_depth));
    }
  }
  if (c.pp > 1) {
    o.push_back(std::string("parallel.pipeline.schedule=") + quoted(pl::to_string(c.schedule)));
    if (c.schedule == pl::Schedule::kInterleaved) {
      o.push_back("parallel.pipeline.chunks=" + std::to_string(c.chunks));
    }
  }
  if (c.sp_mode == pl::SpMode::kMegatron) {
    o.push_back("parallel.sequence.size=1");
    o.push_back("parallel.sequence.mode=\"megatron\"");
  } else {
    o.push_back("parallel.sequence.size=" + std::to_string(c.sp));
    if (c.sp > 1)
      o.push_back(std::string("parallel.sequence.mode=") + quoted(pl::to_string(c.sp_mode)));
    if (c.sp_mode == pl::SpMode::kHybrid) {
      o.push_back("parallel.sequence.ulysses=" + std::to_string(c.ulysses));
    }
  }
  return o;
}

// The candidate a config describes as it stands.
pl::Candidate candidate_of(const RunConfig& config, const RunPlan& plan) {
  pl::Candidate c;
  c.pp = plan.shape.pp, c.dp = plan.shape.dp, c.sp = plan.shape.sp, c.tp = plan.shape.tp;
  const auto& p = config.parallel;
  const std::string& tm = p.tensor.mode;
  c.tp_mode = tm == "2d"     ? pl::TpMode::k2D
              : tm == "2.5d" ? pl::TpMode::k2p5D
              : tm == "3d"   ? pl::TpMode::k3D
                             : pl::TpMode::k1D;
  if (c.tp_mode == pl::TpMode::k2p5D) config.section("parallel.tensor").read("depth", c.tp_depth);
  const std::string& sm = p.sequence.mode;
  if (sm == "megatron") {
    c.sp_mode = pl::SpMode::kMegatron;
  } else if (c.sp > 1) {
    c.sp_mode = sm == "ring"     ? pl::SpMode::kRing
                : sm == "hybrid" ? pl::SpMode::kHybrid
                                 : pl::SpMode::kUlysses;
    if (c.sp_mode == pl::SpMode::kHybrid)
      config.section("parallel.sequence").read("ulysses", c.ulysses);
  }
  if (c.pp > 1) {
    std::string s = "1f1b";
    config.section("parallel.pipeline").read("schedule", s);
    c.schedule = s == "gpipe"         ? pl::Schedule::kGPipe
                 : s == "interleaved" ? pl::Schedule::kInterleaved
                 : s == "zb"          ? pl::Schedule::kZeroBubble
                                      : pl::Schedule::k1F1B;
    config.section("parallel.pipeline").read("chunks", c.chunks);
  }
  c.microbatches = plan.accumulation;
  c.zero = static_cast<int>(p.zero.stage);
  c.micro_batch = config.train.micro_batch;
  const std::string& r = config.train.recompute;
  c.recompute = r == "full"        ? pl::Recompute::kFull
                : r == "selective" ? pl::Recompute::kSelective
                                   : pl::Recompute::kNone;
  return c;
}

// A refusal's words without its numbers and file position, so that the
// same reason for different sizes counts once.
std::string reason_of(const std::string& message) {
  std::string line = message.substr(0, message.find('\n'));
  static const std::regex position(R"(^[^ ]*:\d+(:\d+)?: )");
  line = std::regex_replace(line, position, "");
  static const std::regex number(R"(\d+(\.\d+)?)");
  line = std::regex_replace(line, number, "N");
  if (line.size() > 110) line = line.substr(0, 107) + "...";
  return "kolos refuses: " + line;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

// ---- calibration -----------------------------------------------------

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The group mean of a per-rank value.
double group_mean(comm::ProcessGroup& g, double x) {
  at::Tensor t = at::full({1}, x, at::kDouble);
  g.all_reduce(t)->wait();
  return t.item<double>() / g.size();
}
double group_max(comm::ProcessGroup& g, double x) {
  at::Tensor t = at::full({1}, x, at::kDouble);
  g.all_reduce(t, comm::ReduceOp::kMax)->wait();
  return t.item<double>();
}

// Seconds per call of `fn`, every rank running it at once: a warm-up, then
// as many calls as fill about `target` seconds (rank 0's count, so that the
// ranks overlap). The time is the whole group's, from the barrier before
// until the last rank is done, over the calls: what each rank gets of the
// machine while all of them work, however the cores were shared among them.
template <typename F>
double timed(comm::ProcessGroup& world, F&& fn, double target = 0.15) {
  fn();
  world.barrier()->wait();
  auto t0 = Clock::now();
  fn();
  double once = std::max(seconds_since(t0), 1e-7);
  at::Tensor n =
      at::full({1}, static_cast<int64_t>(std::clamp(target / once, 2.0, 20000.0)), at::kLong);
  world.broadcast(n, 0)->wait();
  const int64_t reps = n.item<int64_t>();
  world.barrier()->wait();
  t0 = Clock::now();
  for (int64_t i = 0; i < reps; ++i) fn();
  world.barrier()->wait();
  return group_max(world, seconds_since(t0)) / static_cast<double>(reps);
}

pl::MachineRates measure(const comm::ProcessGroupPtr& world_ptr, const RunConfig& config) {
  comm::ProcessGroup& world = *world_ptr;
  const int n = world.size();
  pl::MachineRates r;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  at::manual_seed(1234 + world.rank());

  // Matrix products, square, n = 32 .. 1024: FLOP/s by size.
  for (const int64_t k : {32, 64, 128, 256, 512, 1024}) {
    const at::Tensor a = at::randn({k, k}, opts), b = at::randn({k, k}, opts);
    at::Tensor c = at::empty({k, k}, opts);
    const double s = timed(world, [&] { at::mm_out(c, a, b); });
    const double flops = 2.0 * static_cast<double>(k * k * k);
    r.gemm_curve.emplace_back(flops, flops / s);
  }
  r.gemm_flops = r.gemm_curve.back().second;

  // The attention core at the model's shape (one sequence, every head),
  // forward and backward: 3 x the forward's 4·s²·h FLOPs.
  const ModelConfig& m = config.model;
  const int64_t d = m.hidden / m.heads;
  {
    std::vector<at::Tensor> qkv;
    for (int i = 0; i < 3; ++i)
      qkv.push_back(at::randn({1, m.heads, m.seq_len, d}, opts).requires_grad_());
    const double s = timed(world, [&] {
      at::Tensor out = causal_attention(qkv);
      out.sum().backward();
      for (auto& t : qkv) t.mutable_grad() = at::Tensor();
    });
    r.attention_flops = 3.0 * 4.0 * static_cast<double>(m.seq_len * m.seq_len * m.hidden) / s;
  }

  // Memory-bound kernels at the model's activation size: a LayerNorm, a
  // GELU and a residual add, each reading and writing [s, h] fp32.
  {
    const at::Tensor x = at::randn({m.seq_len, m.hidden}, opts), w = at::ones({m.hidden}, opts),
                     bias = at::zeros({m.hidden}, opts);
    const double s = timed(world, [&] {
      at::Tensor y = at::layer_norm(x, {m.hidden}, w, bias);
      y = at::gelu(y);
      y = y + x;
    });
    r.elementwise_bytes = 3.0 * 2.0 * 4.0 * static_cast<double>(x.numel()) / s;
  }

  // The fixed cost of one operation that autograd records.
  {
    const at::Tensor a = at::ones({8}, opts).requires_grad_(), b = at::ones({8}, opts);
    r.op_seconds = timed(
        world, [&] { (void)(a + b); }, 0.05);
  }

  // A whole GPT block as modules/ builds it (LayerNorm, q/k/v/o with
  // biases, the attention core, a GELU MLP, two residual adds), forward and
  // backward, at micro-batches from 1 to the config's B: measured =
  // block_factor x predicted + block_fixed, a line fitted through them (at
  // B = 1, or a line that does not fit: the ratio at B alone, no fixed part).
  auto block_at = [&](int64_t b) -> std::pair<double, double> {
    const int64_t s = m.seq_len, h = m.hidden;
    const int64_t f = m.mlp_ratio * h;
    auto param = [&](std::initializer_list<int64_t> shape) {
      return (at::randn(shape, opts) * 0.02).requires_grad_();
    };
    const at::Tensor x = at::randn({b, s, h}, opts).requires_grad_();
    const at::Tensor ln_w = at::ones({h}, opts).requires_grad_(), ln_b = param({h});
    const at::Tensor w_qkv = param({3 * h, h}), b_qkv = param({3 * h});
    const at::Tensor w_o = param({h, h}), b_o = param({h});
    const at::Tensor w_1 = param({f, h}), b_1 = param({f}), w_2 = param({h, f}), b_2 = param({h});
    const std::vector<at::Tensor> params = {x,   ln_w, ln_b, w_qkv, b_qkv, w_o,
                                            b_o, w_1,  b_1,  w_2,   b_2};
    const double measured = timed(
        world,
        [&] {
          at::Tensor a = at::layer_norm(x, {h}, ln_w, ln_b);
          const auto qkv =
              at::linear(a, w_qkv, b_qkv).view({b, s, 3, m.heads, d}).permute({2, 0, 3, 1, 4});
          at::Tensor att = causal_attention({qkv[0], qkv[1], qkv[2]});
          att = att.transpose(1, 2).reshape({b, s, h});
          const at::Tensor x2 = x + at::linear(att, w_o, b_o);
          a = at::layer_norm(x2, {h}, ln_w, ln_b);
          const at::Tensor y = x2 + at::linear(at::gelu(at::linear(a, w_1, b_1)), w_2, b_2);
          y.sum().backward();
          for (const auto& t : params) const_cast<at::Tensor&>(t).mutable_grad() = at::Tensor();
        },
        0.6);
    pl::ModelShape shape;
    shape.layers = 1, shape.hidden = h, shape.heads = m.heads, shape.seq_len = s;
    shape.vocab = m.vocab, shape.ffn_multiplier = m.mlp_ratio;
    return {measured, pl::block_seconds(shape, r, static_cast<double>(b), 4.0)};
  };
  {
    // Sizes 1, 2, 4, ... up to B, each measured twice (the fastest kept:
    // another tenant's burst only slows); a least-squares line.
    const int64_t B = config.train.micro_batch;
    std::vector<std::pair<double, double>> points;   // (predicted, measured)
    std::vector<std::pair<double, double>> repeats;  // (first, second) measured
    for (int64_t b = 1;; b = std::min(2 * b, B)) {
      const auto first = block_at(b), second = block_at(b);
      points.emplace_back(first.second, std::min(first.first, second.first));
      repeats.emplace_back(first.first, second.first);
      if (b == B) break;
    }
    const double n = static_cast<double>(points.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [x, y] : points) sx += x, sy += y, sxx += x * x, sxy += x * y;
    const auto& [predicted_B, measured_B] = points.back();
    r.block_factor = measured_B / predicted_B;
    r.block_fixed = 0;
    if (points.size() > 1) {
      const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
      const double fixed = (sy - slope * sx) / n;
      if (slope > 0 && fixed > 0) r.block_factor = slope, r.block_fixed = fixed;
    }
    // The spread (tune.h): the repeats' disagreement (each of a pair has
    // variance sigma^2 in the logarithm, their difference 2 sigma^2) and the
    // fitted line's misses, in the logarithm; the floor of a prediction's
    // uncertainty. Every rank computed the same figures (group times).
    double noise = 0, miss = 0;
    for (const auto& [a, b] : repeats) noise += std::log(a / b) * std::log(a / b) / 2;
    for (const auto& [x, y] : points) {
      const double fitted = r.block_factor * x + r.block_fixed;
      miss += std::log(y / fitted) * std::log(y / fitted);
    }
    r.spread = std::sqrt(noise / static_cast<double>(repeats.size()) + miss / n);
  }
  // The cores the ranks may run on together: the union of their affinities
  // (bound ranks each see their own).
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    at::Tensor mine = at::zeros({CPU_SETSIZE}, at::kInt);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) mine[cpu] = 1;
      }
    }
    world.all_reduce(mine, comm::ReduceOp::kMax)->wait();
    r.cores = static_cast<double>(mine.sum().item<int64_t>());
  }

  // Collectives per group size, every group of consecutive ranks at once
  // (as tensor groups are laid out): alpha + bytes/beta fitted to two sizes.
  for (int g = 2; g <= n; ++g) {
    if (n % g != 0) continue;
    const comm::ProcessGroupPtr group =
        world.split(world.rank() / g, world.rank() % g, "calibrate-" + std::to_string(g));
    for (const pl::Collective op :
         {pl::Collective::kAllReduce, pl::Collective::kAllGather, pl::Collective::kReduceScatter,
          pl::Collective::kAllToAll, pl::Collective::kSendRecv}) {
      if (op == pl::Collective::kSendRecv && g != 2) continue;  // a neighbour's hop: pairs
      double t[2] = {0, 0}, bytes[2] = {64.0 * 1024, 4.0 * 1024 * 1024};
      for (int i = 0; i < 2; ++i) {
        const int64_t numel = static_cast<int64_t>(bytes[i] / 4) / g * g;
        const at::Tensor whole = at::ones({numel}, opts);
        const at::Tensor part = at::ones({numel / g}, opts);
        at::Tensor out_whole = at::empty({numel}, opts), out_part = at::empty({numel / g}, opts);
        const int peer = group->rank() ^ 1;
        auto run = [&] {
          switch (op) {
            case pl::Collective::kAllReduce:
              group->all_reduce(out_whole.copy_(whole))->wait();
              break;
            case pl::Collective::kAllGather:
              group->all_gather_flat(out_whole, part)->wait();
              break;
            case pl::Collective::kReduceScatter:
              group->reduce_scatter_flat(out_part, whole)->wait();
              break;
            case pl::Collective::kAllToAll:
              group->all_to_all(out_whole, whole)->wait();
              break;
            case pl::Collective::kSendRecv:
              if (group->rank() % 2 == 0) {
                group->send(whole, peer)->wait();
                group->recv(out_whole, peer)->wait();
              } else {
                group->recv(out_whole, peer)->wait();
                group->send(whole, peer)->wait();
              }
              break;
          }
        };
        t[i] = group_max(world, timed(world, run, 0.1));
        if (op == pl::Collective::kSendRecv) t[i] /= 2;  // a round trip is two hops
      }
      pl::AlphaBeta ab;
      ab.beta = (bytes[1] - bytes[0]) / std::max(t[1] - t[0], 1e-9);
      ab.alpha = std::max(0.0, t[0] - bytes[0] / ab.beta);
      r.measured[{op, g}] = ab;
    }
    // The sync cost: a small all-reduce right after a piece of compute, as
    // a tensor-parallel layer does it, against the compute alone and the
    // all-reduce's own time back to back.
    {
      const int64_t k = 192;
      const at::Tensor a = at::randn({k, k}, opts), b = at::randn({k, k}, opts);
      at::Tensor c = at::empty({k, k}, opts), small = at::ones({256}, opts);
      const double compute = timed(
          world, [&] { at::mm_out(c, a, b); }, 0.1);
      const double both = timed(
          world,
          [&] {
            at::mm_out(c, a, b);
            group->all_reduce(small)->wait();
          },
          0.1);
      const pl::AlphaBeta& ar = r.measured[{pl::Collective::kAllReduce, g}];
      r.sync[g] = std::max(0.0, both - compute - (ar.alpha + 1024.0 / ar.beta));
    }
  }
  r.source = "calibration";
  return r;
}

// ---- the plugin ------------------------------------------------------

class Autoplan final : public Planner {
 public:
  void configure(const PluginContext& context) override {
    const ConfigSection& s = context.section;
    s.check_keys({"cluster", "calibration", "top", "tune", "tune_steps", "tune_seconds"},
                 context.owner);
    s.read("cluster", settings_.cluster);
    s.read("calibration", settings_.calibration);
    s.read("top", settings_.top);
    if (settings_.top < 1)
      s.fail("top", std::to_string(settings_.top) + " is out of range; it must be >= 1");
    s.read("tune", settings_.tune);
    if (settings_.tune < 0 || settings_.tune > settings_.top) {
      s.fail("tune", std::to_string(settings_.tune) +
                         " is out of range; it must be 0 (train the best prediction untried) "
                         "to planner.top = " +
                         std::to_string(settings_.top) +
                         " (the finalists come from the plans kept)");
    }
    s.read("tune_steps", settings_.trials.steps);
    if (settings_.trials.steps < settings_.trials.warmup + 1 || settings_.trials.steps > 1000) {
      s.fail("tune_steps", std::to_string(settings_.trials.steps) +
                               " is out of range; it must be 3 to 1000 (the first 2 of a "
                               "finalist's steps are not timed)");
    }
    s.read("tune_seconds", settings_.trials.budget_s);
    if (!(settings_.trials.budget_s > 0) || !std::isfinite(settings_.trials.budget_s)) {
      s.fail("tune_seconds",
             std::to_string(settings_.trials.budget_s) + " is out of range; it must be > 0");
    }
    for (const char* key : {"tune_steps", "tune_seconds"}) {
      if (settings_.tune == 0 && s.has(key)) {
        s.fail(key, std::string("has no effect with planner.tune = 0 (no finalist is tried); "
                                "remove it or set planner.tune >= 1"));
      }
    }
    for (const std::string* path : {&settings_.cluster, &settings_.calibration}) {
      if (!path->empty() && !fs::exists(*path)) {
        s.fail(path == &settings_.cluster ? "cluster" : "calibration",
               "\"" + *path + "\" does not exist");
      }
    }
    configured_ = true;
  }

  bool needs_calibration() const override { return settings_.cluster.empty(); }

  void check(const RunConfig& config) const override {
    workload_of(config).model.validate();
    if (!settings_.cluster.empty()) pl::load_cluster(settings_.cluster);
  }

  std::string calibration_path(int64_t ranks) const override {
    if (!settings_.calibration.empty()) return settings_.calibration;
    return cache_dir() + "/calibration/" + host_name() + "-n" + std::to_string(ranks) + ".toml";
  }

  std::string calibrate(const comm::ProcessGroupPtr& world, const RunConfig& config) override {
    const pl::MachineRates rates = measure(world, config);
    const std::string path = calibration_path(world->size());
    std::string error;
    if (world->rank() == 0) {
      try {
        fs::create_directories(fs::path(path).parent_path());
        const std::string tmp = path + ".tmp";
        std::ofstream out(tmp);
        out << "# " << world->size() << " ranks of " << at::get_num_threads()
            << " thread(s); attention and elementwise at seq_len " << config.model.seq_len
            << ", hidden " << config.model.hidden << ", heads " << config.model.heads << "\n"
            << pl::format_calibration(host_name(), rates);
        out.close();
        if (!out) throw Error(tmp + ": cannot write");
        fs::rename(tmp, path);
      } catch (const std::exception& e) {
        error = std::string("calibration: ") + e.what();
      }
    }
    detail::agree_on_error(*world, error, static_cast<int>(ErrorKind::kGeneric));
    return path;
  }

  // The dp reference (tensor and sequence sizes 1) sets the step factor:
  // measured over predicted. A reference in a tensor grid mode (2d, 2.5d,
  // 3d) or in ring sequence parallelism sets, with shared cores, what each
  // of the grid's collectives or the ring's hops costs beyond the model
  // (grid_sync or ring_sync at its size): the part of the measured step the
  // prediction without it leaves over, spread over the collectives the
  // prediction counts on the step's path (its slope in that term).
  void record_reference(const RunConfig& reference, int64_t ranks, double measured) override {
    const std::string path = calibration_path(ranks);
    std::string unused;
    pl::Machine mach = machine_for(reference, ranks, &unused);
    const RunPlan plan = plan_run(reference, ranks);
    const pl::Workload w = workload_of(reference);
    const pl::Candidate c = candidate_of(reference, plan);
    const bool grid = c.tp > 1 && c.tp_mode != pl::TpMode::k1D;
    const bool ring = c.sp > 1 && c.sp_mode == pl::SpMode::kRing && c.tp == 1;
    std::string what;
    if (!grid && !ring) {
      mach.rates.step_factor = 1;
      const double predicted = pl::predict(w, mach, c).step;
      mach.rates.step_factor = measured / predicted;
      std::ostringstream line;
      line << "; reference " << c.describe() << ": measured " << measured << " s, predicted "
           << predicted << " s";
      what = line.str();
    } else {
      std::map<int64_t, double>& table = grid ? mach.rates.grid_sync : mach.rates.ring_sync;
      const int64_t span = grid ? c.tp : c.sp;
      table[span] = 0;
      const double without = pl::predict(w, mach, c).step;
      const double probe = 1e-3;
      table[span] = probe;
      const double slope = (pl::predict(w, mach, c).step - without) / probe;
      table[span] = slope > 0 ? std::max(0.0, (measured - without) / slope) : 0.0;
      std::ostringstream line;
      line << "; " << (grid ? "grid" : "ring") << " reference " << c.describe() << ": measured "
           << measured << " s, predicted " << without << " s without its sync, "
           << table[span] * 1e6 << " us per collective";
      what = line.str();
    }
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);  // the comment line calibrate() wrote, and earlier references'
    const std::string tmp = path + ".tmp";
    std::ofstream out(tmp);
    out << first << what << "\n" << pl::format_calibration(host_name(), mach.rates);
    out.close();
    if (!out) throw Error(tmp + ": cannot write");
    fs::rename(tmp, path);
  }

  // Each measured finalist's measured / model ratio joins its family's
  // [[calibration.feedback]] row in the calibration in use (rank 0 only:
  // the file is rewritten whole, through a temporary file and a rename).
  std::string record_trials(int64_t ranks, const std::vector<TrialResult>& trials) override {
    if (!settings_.cluster.empty()) return "";
    const std::string path = calibration_path(ranks);
    pl::MachineRates rates = pl::load_calibration(path, {});
    int recorded = 0;
    for (const TrialResult& t : trials) {
      if (!t.skipped.empty() || !(t.measured_s > 0) || !(t.plan.model_step_s > 0)) continue;
      pl::add_feedback(rates, t.plan.family, t.measured_s / t.plan.model_step_s);
      ++recorded;
    }
    if (recorded == 0) return "";
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    const std::string tmp = path + ".tmp";
    std::ofstream out(tmp);
    if (first.rfind("#", 0) == 0) out << first << "\n";  // calibrate()'s line, and the references'
    out << pl::format_calibration(host_name(), rates);
    out.close();
    if (!out) throw Error(tmp + ": cannot write");
    fs::rename(tmp, path);
    return path;
  }

  PlanReport plan(const RunConfig& config, int64_t ranks) override {
    return run(config, ranks, /*search=*/true);
  }
  PlanReport predict(const RunConfig& config, int64_t ranks) override {
    return run(config, ranks, /*search=*/false);
  }

 private:
  pl::Machine machine_for(const RunConfig& config, int64_t ranks, std::string* what) const {
    if (!settings_.cluster.empty()) {
      pl::ClusterFile file = pl::load_cluster(settings_.cluster);
      if (!settings_.calibration.empty()) {
        file.rates = pl::load_calibration(settings_.calibration, file.rates);
      }
      *what = "cluster " + settings_.cluster + " (" + file.cluster.name +
              "), rates: " + file.rates.source;
      return {file.cluster, file.rates};
    }
    const std::string path = calibration_path(ranks);
    if (!fs::exists(path)) {
      throw ConfigError("no calibration of this machine for " + std::to_string(ranks) + " ranks (" +
                        path + "); `kolos calibrate CONFIG -n " + std::to_string(ranks) +
                        "` measures it");
    }
    pl::MachineRates rates = pl::load_calibration(path, {});
    pl::Cluster c;
    c.name = host_name();
    c.source = path;
    c.nodes = 1;
    c.devices_per_node = ranks;
    const MemoryBudget budget = memory_budget(config, ranks);
    c.device_memory = budget.bytes;
    c.peak_flops = rates.gemm_flops;
    c.memory_bandwidth = rates.elementwise_bytes;
    // Every pair the calibration did not measure falls back to these: its
    // all-reduce over the whole machine, as a ring.
    const auto it = rates.measured.find({pl::Collective::kAllReduce, ranks});
    const double n = static_cast<double>(ranks);
    c.intra_bandwidth = c.inter_bandwidth =
        it != rates.measured.end() ? it->second.beta * 2 * (n - 1) / n : rates.elementwise_bytes;
    c.intra_latency = c.inter_latency =
        it != rates.measured.end() ? it->second.alpha / std::max(1.0, 2 * (n - 1)) : 0;
    c.nvlink_domain = ranks;
    c.host_bandwidth = rates.elementwise_bytes;
    c.host_memory = budget.bytes * n;
    c.runtime_bytes = resident_bytes();
    *what = "this machine (" + c.name + ", " + std::to_string(ranks) + " ranks; calibration " +
            path + "; memory " + budget.source + ")";
    return {c, rates};
  }

  // kolos's own verdict on candidate `c`: the run it makes must pass
  // plan_run, and its memory estimate must fit the budget.
  std::string accept(const RunConfig& base, const std::string& text, int64_t ranks,
                     const pl::Candidate& c, pl::Prediction& p, double runtime_bytes,
                     double budget) const {
    try {
      RunConfig run = parse_run_config(text, base.source, overrides_of(c));
      plan_run(run, ranks);
      const MemoryEstimate m = estimate_memory(run, ranks, runtime_bytes);
      if (m.peak() > budget) return "memory: kolos's estimate exceeds the rank's budget";
      p.memory = m.peak();
    } catch (const std::exception& e) {
      return reason_of(e.what());
    }
    return "";
  }

  PlanReport run(const RunConfig& config, int64_t ranks, bool search) const {
    KOLOS_CHECK(configured_, "the planner plugin was not configured");
    const pl::Workload w = workload_of(config);
    PlanReport report;
    const pl::Machine mach = machine_for(config, ranks, &report.machine);
    const bool here = settings_.cluster.empty();
    const std::string text = to_toml(config);
    const double budget = mach.cluster.device_memory;
    pl::SearchResult result;
    if (!search) {
      const RunPlan plan = plan_run(config, ranks);
      const pl::Candidate c = candidate_of(config, plan);
      pl::RankedPlan rp{c, pl::predict(w, mach, c)};
      if (here)
        rp.prediction.memory = estimate_memory(config, ranks, mach.cluster.runtime_bytes).peak();
      result.plans.push_back(rp);
      result.evaluated = result.survived = 1;
    } else {
      pl::SearchOptions opt;
      opt.ranks = ranks;
      opt.top = static_cast<size_t>(settings_.top);
      opt.fixed = fixed_of(config);
      if (here) {
        // On this machine the memory role is not planned: its compute
        // budget and chunk size are the user's to set ([memory]).
        opt.offload_fractions = {0.0};
        opt.refine = 100000;
        opt.accept = [&](const pl::Candidate& c, pl::Prediction& p) {
          return accept(config, text, ranks, c, p, mach.cluster.runtime_bytes, budget);
        };
      }
      result = pl::check_fixed(w, mach, opt);
    }
    // The memory role's chunks run whichever plan is chosen (they compose
    // with every layout), but their tier traffic is not modelled here.
    const std::string memory_role = here ? choose_plugins(config).memory : "";
    if (!memory_role.empty()) {
      report.machine += "; the memory role (" + memory_role +
                        ") is on: its traffic between the compute budget and the lower tier is "
                        "not in these predictions";
    }
    report.text = report.machine + "\n" + pl::format_plans(result, w, mach);
    std::ostringstream json;
    json.precision(9);
    json << "{\"machine\":" << json_string(report.machine) << ",\"evaluated\":" << result.evaluated
         << ",\"survived\":" << result.survived << ",\"plans\":[";
    for (size_t i = 0; i < result.plans.size(); ++i) {
      const pl::RankedPlan& rp = result.plans[i];
      PlannedRun pr;
      pr.overrides = overrides_of(rp.candidate);
      pr.describe = rp.candidate.describe();
      pr.step_s = rp.prediction.step;
      pr.memory_bytes = rp.prediction.memory;
      pr.bytes_per_step = rp.prediction.bytes_sent;
      pr.uncertainty = rp.prediction.uncertainty;
      pr.family = pl::family_of(rp.candidate);
      pr.model_step_s = rp.prediction.step / rp.prediction.feedback;
      json << (i ? "," : "") << "{\"describe\":" << json_string(pr.describe)
           << ",\"step_s\":" << pr.step_s << ",\"compute_s\":" << rp.prediction.compute
           << ",\"comm_s\":" << rp.prediction.comm << ",\"bubble_s\":" << rp.prediction.bubble
           << ",\"optimizer_s\":" << rp.prediction.optimizer
           << ",\"memory_bytes\":" << pr.memory_bytes << ",\"bytes_per_step\":" << pr.bytes_per_step
           << ",\"uncertainty\":" << pr.uncertainty << ",\"model_step_s\":" << pr.model_step_s
           << ",\"family\":" << json_string(pr.family) << ",\"overrides\":[";
      for (size_t k = 0; k < pr.overrides.size(); ++k) {
        json << (k ? "," : "") << json_string(pr.overrides[k]);
      }
      json << "]}";
      report.plans.push_back(std::move(pr));
    }
    // The finalists parallel.auto (and kolos plan --tune) tries.
    report.tune = settings_.trials;
    if (search && settings_.tune > 0 && !result.plans.empty()) {
      std::vector<pl::Predicted> predicted;
      for (const pl::RankedPlan& rp : result.plans)
        predicted.push_back({rp.prediction.step, rp.prediction.uncertainty});
      report.finalists = pl::select_finalists(predicted, settings_.tune);
      const pl::Predicted best = *std::min_element(
          predicted.begin(), predicted.end(),
          [](const pl::Predicted& a, const pl::Predicted& b) { return a.step < b.step; });
      double lo = 1e300, hi = 0;
      for (const pl::Predicted& p : predicted) {
        const double m = pl::margin_of(best, p);
        lo = std::min(lo, m), hi = std::max(hi, m);
      }
      char rule[256];
      std::snprintf(rule, sizeof rule,
                    "the best %lld prediction(s) and every plan within %.0f combined standard "
                    "deviations of the best (a margin of %.1f%%%s here)",
                    static_cast<long long>(settings_.tune), pl::kMarginSigmas, 100 * lo,
                    hi > lo * 1.001
                        ? (hi > 10 ? " to over 1000%"
                                   : (" to " + std::to_string(std::lround(100 * hi)) + "%").c_str())
                        : "");
      report.finalist_rule = rule;
      std::ostringstream line;
      line << "\nFinalists (parallel.auto and kolos plan --tune try them):";
      for (const size_t i : report.finalists) line << " #" << i + 1;
      line << ": " << report.finalist_rule << ".\n";
      report.text += line.str();
    }
    json << "],\"finalists\":[";
    for (size_t i = 0; i < report.finalists.size(); ++i)
      json << (i ? "," : "") << report.finalists[i];
    json << "],\"dropped\":{";
    bool first = true;
    for (const auto& [reason, count] : result.dropped) {
      json << (first ? "" : ",") << json_string(reason) << ":" << count;
      first = false;
    }
    json << "}}";
    report.json = json.str();
    return report;
  }

  Settings settings_;
  bool configured_ = false;
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("autoplan", "planner", kolos::Planner, kolos::Autoplan,
                    "chooses dp/tp/pp/sp/ZeRO/recompute from a cost model calibrated on this "
                    "machine or a cluster file (kolos plan, parallel.auto)")
