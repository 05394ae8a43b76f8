// Private to the engine: the metrics file and the progress display.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "kolos/core/engine.h"
#include "kolos/core/format.h"

namespace kolos::detail {

// One JSON object per line per step. Empty path: writes nothing. Flushed
// after every line so a killed run keeps what it measured.
class MetricsWriter {
 public:
  // `header`: a JSON value written first as {"header": header}; empty: none.
  explicit MetricsWriter(const std::string& path, const std::string& header = "");
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const StepMetrics& metrics);

 private:
  std::FILE* file_ = nullptr;
};

std::string to_json(const StepMetrics& metrics);

// `header` (a JSON object, or empty: none) with the member "key": value
// added; a header that is not an object becomes {"plan": header, ...}.
// Empty `value`: `header` unchanged.
std::string header_with(const std::string& header, const std::string& key,
                        const std::string& value);

// "bar": a redrawn bar on stderr; "lines": one line every `every` steps;
// "auto": bar when stderr is a terminal, lines otherwise; "off".
class Progress {
 public:
  Progress(const std::string& mode, int64_t total_steps, int64_t every);
  void update(const StepMetrics& metrics);
  void finish();

 private:
  std::string render(const StepMetrics& metrics, bool bar) const;
  std::string mode_;
  int64_t total_;
  int64_t every_;
  int64_t seen_ = 0;
  double elapsed_ = 0.0;
  bool drawn_ = false;
};

}  // namespace kolos::detail
