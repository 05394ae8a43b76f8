#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine_detail.h"

namespace kolos::detail {

Progress::Progress(const std::string& mode, int64_t total_steps, int64_t every)
    : mode_(mode), total_(total_steps), every_(std::max<int64_t>(1, every)) {
  if (mode_ == "auto") mode_ = isatty(STDERR_FILENO) ? "bar" : "lines";
}

std::string Progress::render(const StepMetrics& m, bool bar) const {
  std::ostringstream out;
  const int width = static_cast<int>(std::to_string(total_).size());
  char head[64];
  std::snprintf(head, sizeof head, "step %*lld/%lld", width, (long long)m.step, (long long)total_);
  out << head;
  if (bar) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * m.step / std::max<int64_t>(1, total_));
    out << " [" << std::string(filled, '#') << std::string(kWidth - filled, '.') << ']';
  }
  char body[160];
  const double eta = seen_ > 0 ? elapsed_ / seen_ * (total_ - m.step) : 0.0;
  std::snprintf(body, sizeof body, " loss %.4f | lr %.2e | gnorm %.3f | %s tok/s | ETA %s",
                m.loss, m.lr, m.grad_norm, format_count(m.tokens_per_s).c_str(),
                format_duration(eta).c_str());
  out << body;
  if (m.moe_blocks > 0) {
    // The routing's imbalance: coefficient of variation of tokens per expert.
    char moe[64];
    std::snprintf(moe, sizeof moe, " | experts cv %.2f", m.expert_cv);
    out << moe;
    if (m.tokens_dropped > 0) out << " dropped " << m.tokens_dropped;
  }
  if (m.idle_fraction > 0) {
    char idle[32];
    std::snprintf(idle, sizeof idle, " | idle %.0f%%", 100 * m.idle_fraction);
    out << idle;
  }
  return out.str();
}

void Progress::update(const StepMetrics& m) {
  ++seen_;
  elapsed_ += m.step_time_s;
  if (mode_ == "off") return;
  if (mode_ == "bar") {
    std::fprintf(stderr, "\r\033[K%s", render(m, true).c_str());
    drawn_ = true;
  } else if (m.step % every_ == 0 || m.step == total_ || m.step == 1) {
    std::fprintf(stderr, "%s\n", render(m, false).c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
  std::fflush(stderr);
}

}  // namespace kolos::detail
