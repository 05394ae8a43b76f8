// tp_bench: tensor parallelism on one GPT shape, under mpirun.
//
//   mpirun -np N build/bin/tp_bench --mode 1d|2d|2.5d|3d|serial [--size N] [--depth D]
//       [--layers 4] [--hidden 256] [--heads 8] [--seq-len 64] [--vocab 4096]
//       [--micro-batch 8] [--global-batch 8] [--steps 8] [--warmup 3] [--set key=value ...]
//
// Builds the Engine as `kolos train` does (synthetic data, progress off,
// `[parallel] tensor = { size, mode, depth }`; serial: tensor size 1), runs
// --steps optimizer steps and times the ones after the first --warmup. For
// every timed step each rank resets and then reads the traffic counters of
// the tensor-parallel groups (the mesh's tp group and the grid's sub-groups,
// DeviceMesh::extra_groups(); the engine's own world reductions of loss and
// timing are not tp traffic). Rank 0 prints:
//   - tp bytes sent per step: the max over ranks and the mean over ranks,
//   - the analytic bytes per step of testing::tp_bytes_per_step
//     (tests/support/tp_volume.h, computed from the shape, not from a run),
//     and measured max / analytic,
//   - the median step time (a step's time is the slowest rank's),
//   - the first and last loss,
// then one `result key=value ...` line that bench/run_tp_bench.sh reads.
// Size defaults to the world size; with a world larger than the tensor size
// the remaining ranks form the data-parallel axis.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/mesh.h"
#include "kolos/core/run_config.h"
#include "kolos/core/runtime.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"
#include "tp_volume.h"

namespace {

struct Options {
  std::string mode = "1d";  // "1d" | "2d" | "2.5d" | "3d" | "serial"
  int64_t size = 0;         // 0: the world size (serial: 1)
  int64_t depth = 1;
  int64_t layers = 4, hidden = 256, heads = 8, seq_len = 64, vocab = 4096;
  int64_t micro_batch = 8, global_batch = 8, steps = 8, warmup = 3;
  std::vector<std::string> overrides;
};

const char* kUsage =
    "usage: tp_bench --mode 1d|2d|2.5d|3d|serial [--size N] [--depth D] [--layers L]\n"
    "                [--hidden H] [--heads A] [--seq-len S] [--vocab V] [--micro-batch M]\n"
    "                [--global-batch B] [--steps T] [--warmup W] [--set key=value ...]\n";

// Parses argv; returns an error message, empty on success.
std::string parse_options(int argc, char** argv, Options* o) {
  const std::vector<std::pair<const char*, int64_t*>> numbers = {
      {"--size", &o->size},
      {"--depth", &o->depth},
      {"--layers", &o->layers},
      {"--hidden", &o->hidden},
      {"--heads", &o->heads},
      {"--seq-len", &o->seq_len},
      {"--vocab", &o->vocab},
      {"--micro-batch", &o->micro_batch},
      {"--global-batch", &o->global_batch},
      {"--steps", &o->steps},
      {"--warmup", &o->warmup}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return "help";
    if (i + 1 >= argc) return "tp_bench: " + arg + " needs a value";
    const std::string value = argv[++i];
    if (arg == "--mode") {
      o->mode = value;
      continue;
    }
    if (arg == "--set") {
      o->overrides.push_back(value);
      continue;
    }
    auto it =
        std::find_if(numbers.begin(), numbers.end(), [&](const auto& n) { return arg == n.first; });
    if (it == numbers.end()) return "tp_bench: unknown argument `" + arg + "`";
    char* end = nullptr;
    const long long number = std::strtoll(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != '\0' || number < 0) {
      return "tp_bench: " + arg + " takes a non-negative integer, got `" + value + "`";
    }
    *it->second = number;
  }
  const std::vector<std::string> modes = {"1d", "2d", "2.5d", "3d", "serial"};
  if (std::find(modes.begin(), modes.end(), o->mode) == modes.end()) {
    return "tp_bench: --mode is one of 1d, 2d, 2.5d, 3d, serial; got `" + o->mode + "`";
  }
  if (o->warmup >= o->steps) {
    return "tp_bench: --warmup (" + std::to_string(o->warmup) + ") must be below --steps (" +
           std::to_string(o->steps) + ")";
  }
  return "";
}

std::string config_text(const Options& o) {
  std::ostringstream s;
  s << "[model]\nname = \"gpt\"\nlayers = " << o.layers << "\nhidden = " << o.hidden
    << "\nheads = " << o.heads << "\nseq_len = " << o.seq_len << "\nvocab = " << o.vocab
    << "\n\n[data]\nkind = \"synthetic\"\n\n"
    << "[optim]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 3\ngrad_clip = 1.0\n\n"
    << "[train]\nglobal_batch = " << o.global_batch << "\nmicro_batch = " << o.micro_batch
    << "\nsteps = " << o.steps << "\nseed = 1234\n\n"
    << "[log]\nprogress = \"off\"\n";
  if (o.mode != "serial") {
    s << "\n[parallel]\ntensor = { size = " << o.size << ", mode = \"" << o.mode << "\"";
    if (o.mode == "2.5d") s << ", depth = " << o.depth;  // tp2p5d's key
    s << " }\n";
  }
  return s.str();
}

uint64_t tp_bytes(const kolos::DeviceMesh& mesh) {
  uint64_t total = mesh.group(kolos::Axis::kTP)->stats().total_bytes();
  for (const auto& g : mesh.extra_groups()) total += g->stats().total_bytes();
  return total;
}

void reset_tp_bytes(const kolos::DeviceMesh& mesh) {
  mesh.group(kolos::Axis::kTP)->reset_stats();
  for (const auto& g : mesh.extra_groups()) g->reset_stats();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench(const kolos::Runtime& runtime, const Options& o) {
  using namespace kolos;
  const bool root = runtime.rank() == 0;
  modules::register_builtin_models();
  RunConfig config;
  std::string error;
  int kind = 0;
  try {
    config = parse_run_config(config_text(o), "<tp_bench>", o.overrides);
  } catch (const Error& e) {
    error = e.what();
    kind = static_cast<int>(e.kind());
  }
  kolos::detail::agree_on_error(*runtime.world(), error, kind);
  Engine engine(config, runtime.world(), [](const RunConfig& c) { return data::make_source(c); });
  if (root) std::printf("tp_bench: %s\n", engine.describe().c_str());

  const DeviceMesh& mesh = engine.mesh();
  std::vector<double> times;
  std::vector<double> losses;
  uint64_t sum = 0, lo = std::numeric_limits<uint64_t>::max(), hi = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    reset_tp_bytes(mesh);
    const StepMetrics m = engine.step();
    losses.push_back(m.loss);
    if (step < o.warmup) continue;
    const uint64_t bytes = tp_bytes(mesh);
    sum += bytes;
    lo = std::min(lo, bytes);
    hi = std::max(hi, bytes);
    times.push_back(m.step_time_s);
  }
  const int64_t timed = o.steps - o.warmup;
  // Per rank: bytes per timed step (the same every step when nothing varies).
  const double mine = static_cast<double>(sum) / static_cast<double>(timed);
  double max_bytes = 0, sum_bytes = 0;
  int varied = lo != hi ? 1 : 0, any_varied = 0;
  MPI_Allreduce(&mine, &max_bytes, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &sum_bytes, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&varied, &any_varied, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const double mean_bytes = sum_bytes / runtime.size();

  const testing::TpShape shape = testing::tp_shape(config, engine.accumulation());
  const double analytic = static_cast<double>(testing::tp_bytes_per_step(shape));
  const double ratio = analytic > 0 ? max_bytes / analytic : 0.0;
  const double step_ms = median(times) * 1e3;

  if (root) {
    const int64_t tp = mesh.size(Axis::kTP), dp = mesh.size(Axis::kDP);
    std::printf(
        "mode %s, %d ranks (tensor %lld, depth %lld, data %lld), %lld micro-batch(es) of "
        "%lld per step, %lld steps (timed: the last %lld)\n",
        o.mode.c_str(), runtime.size(), (long long)tp, (long long)shape.depth, (long long)dp,
        (long long)engine.accumulation(), (long long)shape.batch, (long long)o.steps,
        (long long)timed);
    std::printf("tp bytes/step measured : max over ranks %.0f, mean %.1f%s\n", max_bytes,
                mean_bytes, any_varied ? " (varied between steps on some rank)" : "");
    std::printf("tp bytes/step analytic : %.0f (tests/support/tp_volume.h)\n", analytic);
    if (analytic > 0) {
      std::printf("measured max / analytic: %.6f\n", ratio);
    } else {
      std::printf("measured max / analytic: - (no tensor parallelism)\n");
    }
    std::printf("median step            : %.1f ms (min %.1f, max %.1f over %zu steps)\n", step_ms,
                *std::min_element(times.begin(), times.end()) * 1e3,
                *std::max_element(times.begin(), times.end()) * 1e3, times.size());
    std::printf("loss first -> last     : %.6f -> %.6f\n", losses.front(), losses.back());
    std::printf(
        "result mode=%s ranks=%d bytes_max=%.0f bytes_mean=%.1f analytic=%.0f "
        "ratio=%.6f varied=%d step_ms=%.2f loss_first=%.6f loss_last=%.6f\n",
        o.mode.c_str(), runtime.size(), max_bytes, mean_bytes, analytic, ratio, any_varied, step_ms,
        losses.front(), losses.back());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kolos::Runtime runtime(&argc, &argv);
  Options options;
  const std::string error = parse_options(argc, argv, &options);
  if (error == "help") {
    if (runtime.rank() == 0) std::printf("%s", kUsage);
    return 0;
  }
  if (!error.empty()) {
    if (runtime.rank() == 0) std::fprintf(stderr, "%s\n%s", error.c_str(), kUsage);
    return 2;
  }
  if (options.size == 0) options.size = options.mode == "serial" ? 1 : runtime.size();
  return kolos::run_guarded(runtime, [&] { return bench(runtime, options); });
}
