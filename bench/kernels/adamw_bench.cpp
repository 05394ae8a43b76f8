// Fused AdamW (kolos/kernels) vs torch::optim::AdamW on the same buffers, per
// ISA level and thread count, and both against the memory bandwidth measured
// in the same run by a STREAM-like triad (a = b + s * c).
//
// AdamW moves 28 bytes per fp32 element (read p, g, m, v; write p, m, v);
// the triad 12 (read b, c; write a; write-allocate traffic not counted, as
// STREAM does). The printed "of triad" column is the fused kernel's
// 28 B/element rate over the triad's rate at the same thread count.
//
//   bench_kernels_adamw [--elements=N] [--threads=1,2] [google benchmark flags]
#include <benchmark/benchmark.h>
#include <omp.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kolos/kernels/adamw.h"
#include "kolos/kernels/isa.h"

namespace {

int64_t g_elements = int64_t{1} << 24;  // 64 MiB per buffer: far beyond the caches
std::vector<int> g_threads = {1, 2};

std::vector<float> filled(int64_t n, float x) { return std::vector<float>(n, x); }

void triad(benchmark::State& state, int threads) {
  const int64_t n = g_elements;
  std::vector<float> a = filled(n, 0.f), b = filled(n, 1.f), c = filled(n, 2.f);
  const float s = 3.f;
  for (auto _ : state) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["bytes_per_s"] =
      benchmark::Counter(static_cast<double>(n) * 12 * state.iterations(), benchmark::Counter::kIsRate);
}

void fused(benchmark::State& state, kolos::kernels::Isa isa, int threads) {
  kolos::kernels::force_isa(isa);
  const int64_t n = g_elements;
  std::vector<float> p = filled(n, 1.f), g = filled(n, 0.01f), m = filled(n, 0.f),
                     v = filled(n, 0.f);
  kolos::kernels::AdamWConfig cfg;
  kolos::kernels::adamw_step_fp32(p.data(), g.data(), m.data(), v.data(), n, cfg, threads);
  cfg.weight_decay = 0.01;
  int64_t step = 0;
  for (auto _ : state) {
    cfg.step = ++step;
    kolos::kernels::adamw_step_fp32(p.data(), g.data(), m.data(), v.data(), n, cfg, threads);
    benchmark::ClobberMemory();
  }
  state.counters["elements_per_s"] =
      benchmark::Counter(static_cast<double>(n) * state.iterations(), benchmark::Counter::kIsRate);
}

void torch_adamw(benchmark::State& state, int threads) {
  at::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  const int64_t n = g_elements;
  at::Tensor p = torch::ones({n}).requires_grad_(true);
  p.mutable_grad() = torch::full({n}, 0.01f);
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  opt.step();  // allocates the state: not timed
  for (auto _ : state) opt.step();
  state.counters["elements_per_s"] =
      benchmark::Counter(static_cast<double>(n) * state.iterations(), benchmark::Counter::kIsRate);
}

// Keeps every run's rate by name, prints the usual console table too.
class Collect : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> rate;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      for (const char* key : {"elements_per_s", "bytes_per_s"}) {
        auto it = r.counters.find(key);
        if (it == r.counters.end()) continue;
        // With --benchmark_repetitions the median stands for the name.
        if (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median") continue;
        std::string name = r.benchmark_name();
        for (const std::string suffix : {"_median", "/real_time"})
          if (name.size() > suffix.size() &&
              name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
            name.resize(name.size() - suffix.size());
        rate[name] = it->second.value;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

std::string name_of(const std::string& what, int threads) {
  return what + "/threads:" + std::to_string(threads);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--elements=", 11) == 0) {
      g_elements = std::atoll(argv[i] + 11);
    } else if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      g_threads.clear();
      for (char* s = argv[i] + 10; *s != '\0';) {
        g_threads.push_back(std::atoi(s));
        while (*s != '\0' && *s != ',') ++s;
        if (*s == ',') ++s;
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());

  using kolos::kernels::Isa;
  std::vector<Isa> isas;
  for (int i = 0; i <= static_cast<int>(kolos::kernels::detected_isa()); ++i)
    isas.push_back(static_cast<Isa>(i));
  for (int t : g_threads) {
    benchmark::RegisterBenchmark(name_of("triad", t).c_str(), triad, t)
        ->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(name_of("torch_adamw", t).c_str(), torch_adamw, t)
        ->Unit(benchmark::kMillisecond)->UseRealTime();
    for (Isa isa : isas)
      benchmark::RegisterBenchmark(
          name_of(std::string("fused_adamw/") + kolos::kernels::isa_name(isa), t).c_str(), fused,
          isa, t)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  Collect reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  std::printf("\nAdamW over %lld fp32 elements (28 B/element); triad 12 B/element\n",
              static_cast<long long>(g_elements));
  std::printf("%-12s %7s %12s %12s %9s %12s %9s\n", "isa", "threads", "fused Mel/s",
              "torch Mel/s", "vs torch", "triad GB/s", "of triad");
  for (int t : g_threads) {
    const double tr = reporter.rate[name_of("triad", t)];
    const double th = reporter.rate[name_of("torch_adamw", t)];
    for (Isa isa : isas) {
      const double f =
          reporter.rate[name_of(std::string("fused_adamw/") + kolos::kernels::isa_name(isa), t)];
      std::printf("%-12s %7d %12.1f %12.1f %8.2fx %12.2f %8.0f%%\n", kolos::kernels::isa_name(isa),
                  t, f / 1e6, th / 1e6, th > 0 ? f / th : 0.0, tr / 1e9,
                  tr > 0 ? 100.0 * f * 28 / tr : 0.0);
    }
  }
  benchmark::Shutdown();
  return 0;
}
