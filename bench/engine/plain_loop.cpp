// bench_plain_loop: a plain LibTorch training loop of kolos's GPT, the
// baseline for "kolos on one rank vs a plain loop".
//
//   bench_plain_loop CONFIG.toml [--set key=value ...] [--threads N] [--warmup W]
//
// The model is kolos::modules::build_gpt with the serial layer factory: the
// very modules `kolos train` runs, seeded the same way. Everything around
// it is plain LibTorch and written out here: no engine, no MPI, no
// gradient strategy. Each step does what a single kolos rank does:
//   - the same samples from the run's data source (global indices
//     [s*B, (s+1)*B), cut into micro-batches of train.micro_batch),
//   - zero_grad, forward + mean cross-entropy, (loss / M).backward() per
//     micro-batch,
//   - torch::nn::utils::clip_grad_norm_ (optim.grad_clip),
//   - the learning rate of kolos's warm-up + cosine schedule (the engine's
//     own function, learning_rate_at),
//   - torch::optim::AdamW with the run's betas, eps, weight decay.
// A step's time covers all of it (data included), as kolos's step_time_s
// does. Prints one JSON line: median step time over the steps after the
// first W, tokens/s from that median, and every step's time.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kolos/core/engine.h"  // learning_rate_at
#include "kolos/core/gradient_strategy.h"
#include "kolos/core/layer_factory.h"
#include "kolos/core/run_config.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace {

void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_plain_loop CONFIG.toml [--set key=value ...] [--threads N] "
               "[--warmup W]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  int threads = 1;
  int64_t warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" && i + 1 < argc) {
      overrides.emplace_back(argv[++i]);
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--warmup" && i + 1 < argc) {
      warmup = std::max(0, std::atoi(argv[++i]));
    } else if (config_path.empty() && arg.rfind("--", 0) != 0) {
      config_path = arg;
    } else {
      return usage();
    }
  }
  if (config_path.empty()) return usage();

  try {
    const kolos::RunConfig config = kolos::load_run_config(config_path, overrides);
    at::set_num_threads(threads);
    if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) set_blas_threads(threads);

    const int64_t B = config.train.global_batch;
    const int64_t mb = config.train.micro_batch;
    const int64_t seq = config.model.seq_len;
    if (B % mb != 0) {
      std::fprintf(stderr, "bench_plain_loop: global_batch %lld is not a multiple of micro_batch %lld\n",
                   static_cast<long long>(B), static_cast<long long>(mb));
      return 2;
    }
    const int64_t accumulation = B / mb;

    auto factory = kolos::make_serial_layer_factory();
    torch::manual_seed(config.train.seed);
    std::shared_ptr<kolos::Model> model = kolos::modules::build_gpt(config.model, *factory);
    std::vector<at::Tensor> params;
    for (const auto& p : model->placed_parameters()) params.push_back(p.tensor);
    const kolos::AdamWSettings s = kolos::adamw_settings(config.optim);
    torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(s.lr)
                                              .betas({s.beta1, s.beta2})
                                              .eps(s.eps)
                                              .weight_decay(s.weight_decay));
    auto data = kolos::data::make_source(config);

    std::vector<double> times;
    double first_loss = 0, last_loss = 0;
    for (int64_t step = 0; step < config.train.steps; ++step) {
      const auto start = std::chrono::steady_clock::now();
      optimizer.zero_grad();
      double loss_sum = 0;
      for (int64_t m = 0; m < accumulation; ++m) {
        at::Tensor tokens = torch::empty({mb, seq + 1}, torch::kInt64);
        int64_t* out = tokens.data_ptr<int64_t>();
        for (int64_t i = 0; i < mb; ++i) data->sample(step * B + m * mb + i, out + i * (seq + 1));
        at::Tensor inputs = tokens.narrow(1, 0, seq).contiguous();
        at::Tensor targets = tokens.narrow(1, 1, seq).contiguous();
        at::Tensor loss = model->loss(model->forward(inputs), targets);
        (loss / static_cast<double>(accumulation)).backward();
        loss_sum += loss.item<double>();
      }
      if (config.optim.grad_clip > 0) torch::nn::utils::clip_grad_norm_(params, config.optim.grad_clip);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options())
            .lr(kolos::learning_rate_at(config, step));
      }
      optimizer.step();
      times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      last_loss = loss_sum / static_cast<double>(accumulation);
      if (step == 0) first_loss = last_loss;
    }

    const size_t skip = std::min<size_t>(static_cast<size_t>(warmup), times.size() > 1 ? times.size() - 1 : 0);
    const double med = median(std::vector<double>(times.begin() + skip, times.end()));
    std::ostringstream json;
    json.precision(6);
    json << "{\"bench\":\"plain_loop\",\"model\":\"kolos::modules::build_gpt (serial factory)\""
         << ",\"threads\":" << threads << ",\"steps\":" << times.size() << ",\"warmup\":" << skip
         << ",\"global_batch\":" << B << ",\"micro_batch\":" << mb << ",\"seq_len\":" << seq
         << ",\"step_time_s_median\":" << med
         << ",\"tokens_per_s\":" << static_cast<double>(B * seq) / std::max(1e-12, med)
         << ",\"first_loss\":" << first_loss << ",\"final_loss\":" << last_loss
         << ",\"step_times_s\":[";
    for (size_t i = 0; i < times.size(); ++i) json << (i ? "," : "") << times[i];
    json << "]}";
    std::cout << json.str() << std::endl;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_plain_loop: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
