// bench_pipeline: every pipeline schedule on the same GPT and the same ranks.
//
//   mpirun -n P bench_pipeline [--steps N] [--warmup W] [--set key=value ...]
//
// For each schedule (gpipe, 1f1b, interleaved with chunks = 2, zb) it trains
// N steps after W warm-up steps and prints, on rank 0, one line per
// schedule: the measured idle fraction (the executor's per-step timeline:
// 1 - compute time / step time, averaged over steps and ranks), the
// theoretical bubble of the schedule (plan.h: (P-1)/(M+P-1) for gpipe and
// 1F1B, (P-1)/(V*M+P-1) interleaved, ZB-H1's (P-1)(F+BI-W)/(M(F+BI+W) +
// (P-1)(F+BI-W)) with F = BI = W), their ratio, and the median step time
// with its ratio to 1F1B's. A final JSON line holds the same numbers.
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kolos/core/comm/mpi.h"
#include "kolos/core/engine.h"
#include "kolos/core/run_config.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"
#include "kolos/schedules/plan.h"

namespace {

const char* kModel = R"(
[model]
name = "gpt"
layers = 6
hidden = 128
heads = 4
seq_len = 64
vocab = 512

[data]
kind = "synthetic"

[optim]
lr = 1e-3
warmup_steps = 2

[train]
global_batch = 32
micro_batch = 4
steps = 1000

[log]
progress = "off"
)";

struct Result {
  std::string schedule;
  int chunks = 1;
  double idle = 0.0, theory = 0.0, median_s = 0.0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  at::set_num_threads(1);
  int steps = 10, warmup = 3;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--warmup") && i + 1 < argc)
      warmup = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--set") && i + 1 < argc)
      sets.push_back(argv[++i]);
  }
  kolos::modules::register_builtin_models();
  std::vector<Result> results;
  int micro = 0;
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved", "zb"}) {
    Result r;
    r.schedule = schedule;
    r.chunks = schedule == "interleaved" ? 2 : 1;
    std::vector<std::string> overrides = sets;
    overrides.push_back("parallel.pipeline.size=" + std::to_string(size));
    overrides.push_back("parallel.pipeline.schedule=" + schedule);
    overrides.push_back("parallel.pipeline.chunks=" + std::to_string(r.chunks));
    kolos::RunConfig config = kolos::parse_run_config(kModel, "<bench>", overrides);
    kolos::Engine engine(config, kolos::comm::make_mpi_process_group(MPI_COMM_WORLD, "world"),
                         [](const kolos::RunConfig& c) { return kolos::data::make_source(c); });
    micro = static_cast<int>(engine.accumulation());
    std::vector<double> times;
    double idle = 0.0;
    for (int s = 0; s < warmup + steps; ++s) {
      const kolos::StepMetrics m = engine.step();
      if (s < warmup) continue;
      times.push_back(m.step_time_s);
      idle += m.idle_fraction;
    }
    idle /= steps;
    MPI_Allreduce(MPI_IN_PLACE, &idle, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    r.idle = idle / size;
    r.median_s = median(times);
    const auto plan = kolos::pipeline::make_plan(kolos::pipeline::parse_schedule(schedule), size,
                                                 micro, r.chunks);
    r.theory = plan.theoretical_bubble(1, 1, 1);
    results.push_back(r);
  }
  if (rank == 0) {
    double base = 0.0;
    for (const auto& r : results) {
      if (r.schedule == "1f1b") base = r.median_s;
    }
    std::printf("pipeline P=%d M=%d (%d steps after %d warm-up)\n", size, micro, steps, warmup);
    std::printf("%-12s %3s %10s %10s %8s %12s %10s\n", "schedule", "V", "idle", "theory", "ratio",
                "step (ms)", "vs 1f1b");
    std::string json = "{\"P\": " + std::to_string(size) + ", \"M\": " + std::to_string(micro) +
                       ", \"schedules\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      std::printf("%-12s %3d %10.3f %10.3f %8.2f %12.1f %10.2f\n", r.schedule.c_str(), r.chunks,
                  r.idle, r.theory, r.theory > 0 ? r.idle / r.theory : 0.0, r.median_s * 1e3,
                  base > 0 ? r.median_s / base : 0.0);
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "%s{\"schedule\": \"%s\", \"chunks\": %d, \"idle\": %.4f, \"theory\": %.4f, "
                    "\"step_ms\": %.2f}",
                    i ? ", " : "", r.schedule.c_str(), r.chunks, r.idle, r.theory,
                    r.median_s * 1e3);
      json += buf;
    }
    std::printf("%s]}\n", json.c_str());
  }
  MPI_Finalize();
  return 0;
}
