// What the config tests share: the ConfigError a call throws, a parse's
// error message, a check that a message names every part, and a config
// that sets every key.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/core/run_config.h"

namespace kolos::config_test {

inline constexpr const char* kName = "run.toml";


// The message of the ConfigError that `fn` throws; fails the test if it
// throws nothing or something else.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ConfigError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ConfigError, nothing was thrown";
  return "";
}

inline std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_run_config(text, kName, overrides); });
}

// Every one of `parts` occurs in `message`.
inline ::testing::AssertionResult has_all(const std::string& message,
                                   const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "missing `" << part << "` in:\n" << message;
    }
  }
  return ::testing::AssertionSuccess();
}

inline constexpr const char* kFullConfig = R"(# every section
[model]
name = "gpt"
layers = 12
hidden = 768
heads = 12
seq_len = 1024
vocab = 50304
mlp_ratio = 4
init_std = 0.01

[data]
kind = "tokens"
path = "data/train.bin"
dtype = "uint16"

[optim]
name = "adamw"
lr = 3e-4
min_lr = 3e-5
warmup_steps = 100
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
weight_decay = 0.1
grad_clip = 1
fused = false

[train]
global_batch = 64
micro_batch = 4
steps = 1000
seed = 7
precision = "fp32"

[parallel]
data = 2
tensor = { size = 4, mode = "2d" }
pipeline = { size = 2, schedule = "interleaved", microbatches = 8, chunks = 2 }
sequence = { size = 1 }
zero = { stage = 2 }
bucket_mb = 50
bucket_kb = 512

[log]
metrics = "metrics.jsonl"
every = 10
progress = "lines"

[plugins]
path = ["build/plugins", "/opt/kolos/plugins"]
layers = "tp2d"
gradients = "zero2"
)";

}  // namespace kolos::config_test

namespace kolos {
// What the config tests call unqualified.
using config_test::error_of;
using config_test::has_all;
using config_test::kFullConfig;
using config_test::kName;
using config_test::parse_error;
}  // namespace kolos
