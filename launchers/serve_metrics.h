// `kolos serve`'s counters, gauges and latency histograms, which /metrics
// shows in Prometheus's text format (launchers/serve_metrics.cpp).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <ostream>

namespace kolos::cli::serve {

// A Prometheus histogram of seconds (cumulative buckets, sum, count).
class Histogram {
 public:
  void observe(double seconds);
  void write(std::ostream& out, const char* name, const char* help) const;

 private:
  static constexpr std::array<double, 12> kBounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,   1,    2.5,   5,    10};
  mutable std::mutex mutex_;
  std::array<int64_t, 12> counts_{};
  double sum_ = 0;
  int64_t count_ = 0;
};

struct Metrics {
  std::atomic<int64_t> requests{0}, rejected{0}, prompt_tokens{0}, generated_tokens{0};
  std::atomic<int64_t> running{0}, waiting{0}, blocks_used{0}, blocks_total{0}, preemptions{0};
  Histogram ttft;         // arrival to first token
  Histogram inter_token;  // between consecutive tokens of a request
};

}  // namespace kolos::cli::serve
