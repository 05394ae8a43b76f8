// Prints the planner's choices and predictions next to the configurations
// and throughputs published by Narayanan et al., "Efficient Large-Scale
// Language Model Training on GPU Clusters Using Megatron-LM" (SC '21,
// arXiv:2104.04473), Table 1: GPT models of 1.7B to 1T parameters on up to
// 3072 A100-80GB GPUs (vocabulary 51,200, sequence 2048).
//
//   kolos_planner_megatron examples/clusters/a100-80gb-ib.toml [rows]
//
// For each row: the published layout as the cost model predicts it (tensor
// mode 1d, no sequence parallelism, no ZeRO, full recomputation, the best
// schedule and micro-batch that fit), and the planner's own first choice.
// TFLOP/s per GPU are counted as the paper counts them (megatron_step_flops).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "kolos/planner/search.h"

using namespace kolos::planner;

namespace {

struct Row {
  double billions;
  int64_t heads, hidden, layers, tp, pp, gpus, batch;
  double tflops;  // achieved per GPU, published
};

// Table 1 of Narayanan et al. (2021).
const Row kRows[] = {
    {1.7, 24, 2304, 24, 1, 1, 32, 512, 137},
    {3.6, 32, 3072, 30, 2, 1, 64, 512, 138},
    {7.5, 32, 4096, 36, 4, 1, 128, 512, 142},
    {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
    {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138},
    {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140},
    {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148},
    {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155},
    {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163},
    {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163},
};

std::string layout(const Candidate& c) {
  std::string out = "tp " + std::to_string(c.tp);
  if (c.tp > 1 && c.tp_mode != "1d") out += " " + c.tp_mode;
  out += " pp " + std::to_string(c.pp) + " dp " + std::to_string(c.dp);
  if (!c.sp_mode.empty()) {
    out += " sp " + std::to_string(c.sp) + " " + c.sp_mode;
    if (c.ulysses > 1) out += " a" + std::to_string(c.ulysses);
  }
  if (c.pp > 1) {
    out += std::string(" ") + to_string(c.schedule);
    if (c.schedule == Schedule::kInterleaved) out += " V" + std::to_string(c.chunks);
  }
  out += " mb " + std::to_string(c.micro_batch);
  if (c.zero > 0) out += " zero" + std::to_string(c.zero);
  out += std::string(" ") + to_string(c.recompute);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CLUSTER.toml [rows]\n", argv[0]);
    return 2;
  }
  try {
    const ClusterFile file = load_cluster(argv[1]);
    const Machine machine{file.cluster, file.rates};
    const int rows = argc > 2 ? std::atoi(argv[2]) : static_cast<int>(std::size(kRows));
    std::printf("Cluster %s (%s); rates: %s\n\n", file.cluster.name.c_str(), argv[1],
                file.rates.source.c_str());
    std::printf(
        "| params | GPUs | batch | published tp/pp/dp | published TFLOP/s/GPU | kolos: published "
        "layout | predicted TFLOP/s/GPU | kolos: planner's choice | predicted TFLOP/s/GPU | "
        "search s |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < rows; ++i) {
      const Row& r = kRows[i];
      Workload w;
      w.model.name =
          "gpt-" + std::to_string(r.billions).substr(0, std::to_string(r.billions).find('.') + 2) +
          "B";
      w.model.layers = r.layers, w.model.hidden = r.hidden, w.model.heads = r.heads;
      w.model.seq_len = 2048, w.model.vocab = 51200;
      w.global_batch = r.batch;
      w.precision = "fp16";
      SearchOptions opt;
      opt.ranks = r.gpus;
      opt.offload_fractions = {0.0};
      opt.top = 1;
      SearchOptions published = opt;
      published.fixed.tp = r.tp, published.fixed.pp = r.pp, published.fixed.sp = 1;
      published.fixed.zero = 0, published.fixed.recompute = "full";
      published.fixed.tp_mode = "1d", published.fixed.sp_mode = "";
      const SearchResult pub = search(w, machine, published);
      const SearchResult own = search(w, machine, opt);
      const int64_t dp = r.gpus / (r.tp * r.pp);
      std::printf("| %.1fB | %lld | %lld | %lld/%lld/%lld | %.0f | ", r.billions,
                  static_cast<long long>(r.gpus), static_cast<long long>(r.batch),
                  static_cast<long long>(r.tp), static_cast<long long>(r.pp),
                  static_cast<long long>(dp), r.tflops);
      if (pub.plans.empty()) {
        std::printf("does not fit: %s | - | ", pub.killer.c_str());
      } else {
        const RankedPlan& p = pub.plans.front();
        std::printf("%s | %.0f | ", layout(p.candidate).c_str(),
                    p.prediction.model_flops_per_gpu / 1e12);
      }
      if (own.plans.empty()) {
        std::printf("no plan: %s | - | %.1f |\n", own.killer.c_str(), own.seconds);
      } else {
        const RankedPlan& p = own.plans.front();
        std::printf("%s | %.0f | %.1f |\n", layout(p.candidate).c_str(),
                    p.prediction.model_flops_per_gpu / 1e12, own.seconds);
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolos_planner_megatron: %s\n", e.what());
    return 1;
  }
  return 0;
}
