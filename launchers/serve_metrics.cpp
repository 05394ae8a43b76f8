// `kolos serve`'s /metrics: the latency histograms and the server's
// counters and gauges, in Prometheus's text format (version 0.0.4).
#include "serve_metrics.h"

#include <sstream>
#include <string>

#include "serve_server.h"

namespace kolos::cli::serve {

void Histogram::observe(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < kBounds.size(); ++i) counts_[i] += seconds <= kBounds[i] ? 1 : 0;
  sum_ += seconds;
  ++count_;
}

void Histogram::write(std::ostream& out, const char* name, const char* help) const {
  std::lock_guard<std::mutex> lock(mutex_);
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  for (size_t i = 0; i < kBounds.size(); ++i) {
    out << name << "_bucket{le=\"" << kBounds[i] << "\"} " << counts_[i] << "\n";
  }
  out << name << "_bucket{le=\"+Inf\"} " << count_ << "\n"
      << name << "_sum " << sum_ << "\n"
      << name << "_count " << count_ << "\n";
}

std::string Server::metrics_text() const {
  std::ostringstream out;
  auto gauge = [&](const char* name, const char* help, const char* type, int64_t v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
        << name << " " << v << "\n";
  };
  gauge("kolos_requests_total", "Requests admitted.", "counter", metrics.requests);
  gauge("kolos_requests_rejected_total", "Requests refused after parsing.", "counter",
        metrics.rejected);
  gauge("kolos_prompt_tokens_total", "Prompt tokens of admitted requests.", "counter",
        metrics.prompt_tokens);
  gauge("kolos_generation_tokens_total", "Tokens generated.", "counter", metrics.generated_tokens);
  gauge("kolos_requests_running", "Sequences with blocks in the KV cache.", "gauge",
        metrics.running);
  gauge("kolos_requests_waiting", "Requests queued or preempted.", "gauge", metrics.waiting);
  gauge("kolos_kv_blocks_in_use", "KV cache blocks in use.", "gauge", metrics.blocks_used);
  gauge("kolos_kv_blocks_total", "KV cache blocks in the pool.", "gauge", metrics.blocks_total);
  gauge("kolos_preemptions_total", "Sequences preempted (recomputed later).", "counter",
        metrics.preemptions);
  metrics.ttft.write(out, "kolos_time_to_first_token_seconds",
                     "From admission to a request's first token.");
  metrics.inter_token.write(out, "kolos_inter_token_latency_seconds",
                            "Between consecutive tokens of a request.");
  return out.str();
}

}  // namespace kolos::cli::serve
