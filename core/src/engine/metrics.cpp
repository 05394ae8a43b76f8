#include <cerrno>
#include <cstring>
#include <sstream>

#include "engine_detail.h"
#include "kolos/core/error.h"

namespace kolos::detail {

std::string to_json(const StepMetrics& m) {
  std::ostringstream out;
  out.precision(9);
  out << "{\"step\":" << m.step << ",\"loss\":" << m.loss << ",\"lr\":" << m.lr
      << ",\"grad_norm\":" << m.grad_norm << ",\"step_time_s\":" << m.step_time_s
      << ",\"tokens_per_s\":" << m.tokens_per_s << ",\"idle_fraction\":" << m.idle_fraction
      << ",\"peak_rss_bytes\":" << m.peak_rss_bytes
      << ",\"param_bytes\":" << m.memory.parameter_bytes
      << ",\"grad_bytes\":" << m.memory.gradient_bytes
      << ",\"optimizer_bytes\":" << m.memory.optimizer_bytes
      << ",\"reduction_overlap\":" << m.reduction.overlap_fraction()
      << ",\"reduction_wait_s\":" << m.reduction.wait_s;
  if (!m.reduction.all_reduce_path.empty()) {
    out << ",\"allreduce\":\"" << m.reduction.all_reduce_path << "\"";
  }
  if (m.gather.bytes > 0) {
    out << ",\"gather_bytes\":" << m.gather.bytes
        << ",\"gather_ahead\":" << m.gather.ahead_fraction()
        << ",\"gather_wait_s\":" << m.gather.wait_s;
  }
  if (m.loss_scale > 0) {
    out << ",\"loss_scale\":" << m.loss_scale << ",\"skipped\":" << (m.skipped ? "true" : "false");
  }
  if (m.moe_blocks > 0) {
    out << ",\"expert_tokens_min\":" << m.expert_tokens_min
        << ",\"expert_tokens_max\":" << m.expert_tokens_max << ",\"expert_cv\":" << m.expert_cv
        << ",\"tokens_dropped\":" << m.tokens_dropped << ",\"aux_loss\":" << m.aux_loss;
  }
  if (m.eval_loss >= 0) {
    out << ",\"eval_loss\":" << m.eval_loss;
    if (m.eval_accuracy >= 0) out << ",\"eval_accuracy\":" << m.eval_accuracy;
  }
  out << "}";
  return out.str();
}

std::string header_with(const std::string& header, const std::string& key,
                        const std::string& value) {
  if (value.empty()) return header;
  const std::string member = "\"" + key + "\":" + value;
  if (header.empty()) return "{" + member + "}";
  const size_t open = header.find_first_not_of(" \t\n");
  const size_t close = header.find_last_not_of(" \t\n");
  if (open == std::string::npos || header[open] != '{' || header[close] != '}') {
    return "{\"plan\":" + header + "," + member + "}";
  }
  const bool empty = header.find_first_not_of(" \t\n", open + 1) == close;
  return header.substr(0, close) + (empty ? "" : ",") + member + "}";
}

MetricsWriter::MetricsWriter(const std::string& path, const std::string& header) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) {
    throw Error("log.metrics: cannot open `" + path + "` for writing: " + std::strerror(errno));
  }
  if (!header.empty()) {
    const std::string line = "{\"header\":" + header + "}\n";
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::write(const StepMetrics& metrics) {
  if (file_ == nullptr) return;
  std::string line = to_json(metrics) + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace kolos::detail
