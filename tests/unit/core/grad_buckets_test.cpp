// The gradient-bucket engine on one process: a recording process group
// (every collective completes at once) shows which bucket is launched first,
// before and after the buckets are rebuilt in the recorded ready order.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kolos/core/grad_buckets.h"
#include "kolos/core/layer_factory.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

class CompletedWork : public comm::Work {
 public:
  bool is_completed() const override { return true; }
  void wait(std::chrono::milliseconds) override {}
};

// Two ranks in name only: records what is launched, reduces nothing.
class RecordingGroup : public comm::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "recording"; }
  comm::WorkPtr all_reduce(const at::Tensor& tensor, comm::ReduceOp) override {
    launched.push_back(tensor);
    return std::make_shared<CompletedWork>();
  }
  comm::WorkPtr broadcast(const at::Tensor&, int) override {
    ++broadcasts;
    return std::make_shared<CompletedWork>();
  }
  comm::CommStats stats() const override { return {}; }
  void reset_stats() override {}

  std::vector<at::Tensor> launched;
  int broadcasts = 0;

 private:
  std::string name_ = "recording";
};

bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

TEST(GradBuckets, FirstBucketAfterTheFirstBackwardHoldsTheLastBlocks) {
  modules::register_builtin_models();
  ModelConfig config;
  config.layers = 4;
  config.hidden = 32;
  config.heads = 4;
  config.seq_len = 8;
  config.vocab = 64;
  auto factory = make_serial_layer_factory();
  torch::manual_seed(1);
  auto model = build_model(config, *factory);

  std::vector<GradBuckets::Param> params;
  std::map<std::string, at::Tensor> by_name;
  for (const auto& p : model->placed_parameters()) {
    params.push_back(GradBuckets::Param{p.name, p.tensor, {}});
    by_name[p.name] = p.tensor;
  }
  auto group = std::make_shared<RecordingGroup>();
  GradBuckets::Options options;
  options.bucket_bytes = 32 * 1024;  // below one block (~50 KiB): several buckets
  GradBuckets buckets(params, group, options);

  const at::Tensor tokens = torch::randint(0, config.vocab, {2, config.seq_len + 1});
  const at::Tensor x = tokens.narrow(1, 0, config.seq_len).contiguous();
  const at::Tensor y = tokens.narrow(1, 1, config.seq_len).contiguous();
  auto one_step = [&] {
    group->launched.clear();
    buckets.zero_grad();
    buckets.prepare_backward(/*sync=*/true);
    model->loss(model->forward(x), y).backward();
    buckets.finish_backward();
  };

  one_step();
  EXPECT_FALSE(buckets.rebuilt());
  EXPECT_EQ(group->broadcasts, 1) << "the recorded order is agreed once, after the first step";
  one_step();
  ASSERT_TRUE(buckets.rebuilt());
  const auto layout = buckets.buckets();
  ASSERT_GE(layout.size(), 3u);
  ASSERT_EQ(group->launched.size(), layout.size()) << "one all_reduce per bucket";

  // The first bucket launched is bucket 0, and it holds the last block's
  // gradients (ready first), not the tied token embedding (ready last).
  const std::string last_block = "h." + std::to_string(config.layers - 1) + ".";
  bool has_last_block = false;
  for (const auto& name : layout.front()) {
    EXPECT_TRUE(starts_with(name, last_block) || starts_with(name, "head.")) << name;
    has_last_block |= starts_with(name, last_block);
    EXPECT_TRUE(same_storage(by_name.at(name).grad(), group->launched.front())) << name;
  }
  EXPECT_TRUE(has_last_block) << "first bucket: " << layout.front().front();
  const auto& last = layout.back();
  EXPECT_NE(std::find(last.begin(), last.end(), "embed.wte.weight"), last.end())
      << "the tied embedding's gradient is final last";
  EXPECT_TRUE(same_storage(by_name.at("embed.wte.weight").grad(), group->launched.back()));
  const ReductionStats stats = buckets.stats();
  EXPECT_EQ(stats.reductions, static_cast<int64_t>(layout.size()));
  EXPECT_GT(stats.bytes_during_backward, 0);
}

// Parameters registered in the opposite order of their use: reversed
// registration order (the initial guess) launches the bucket that is ready
// last first; the rebuilt buckets follow the order gradients became ready.
TEST(GradBuckets, RebuildFollowsTheRecordedReadyOrder) {
  torch::manual_seed(2);
  std::vector<GradBuckets::Param> params;
  for (const char* name : {"a", "b", "c"}) {
    params.push_back(GradBuckets::Param{name, torch::randn({256}).requires_grad_(true), {}});
  }
  auto group = std::make_shared<RecordingGroup>();
  GradBuckets::Options options;
  options.bucket_bytes = 1024;  // one parameter per bucket
  GradBuckets buckets(params, group, options);
  auto bucket_names = [&] {
    std::vector<std::string> names;
    for (const auto& b : buckets.buckets()) names.push_back(b.at(0));
    return names;
  };
  EXPECT_EQ(bucket_names(), (std::vector<std::string>{"c", "b", "a"}));

  const at::Tensor x = torch::randn({256});
  auto one_step = [&] {
    group->launched.clear();
    buckets.zero_grad();
    buckets.prepare_backward(true);
    // c is used first, a last: backward makes a's gradient first.
    at::Tensor h = torch::tanh(params[2].tensor * x);
    h = torch::tanh(params[1].tensor * h);
    (params[0].tensor * h).sum().backward();
    buckets.finish_backward();
  };
  one_step();
  ASSERT_EQ(group->launched.size(), 3u);
  EXPECT_TRUE(same_storage(group->launched.front(), params[2].tensor.grad()));
  one_step();
  EXPECT_EQ(bucket_names(), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(group->launched.size(), 3u);
  EXPECT_TRUE(same_storage(group->launched.front(), params[0].tensor.grad()));
}

// A rebuild moves the gradients to new buffers but keeps the .grad tensors
// themselves, which an optimizer holds.
TEST(GradBuckets, RebuildKeepsTheGradTensors) {
  std::vector<GradBuckets::Param> params;
  for (const char* name : {"a", "b"}) {
    params.push_back(GradBuckets::Param{name, torch::ones({64}).requires_grad_(true), {}});
  }
  auto group = std::make_shared<RecordingGroup>();
  GradBuckets::Options options;
  options.bucket_bytes = 256;
  GradBuckets buckets(params, group, options);
  const at::Tensor held = params[0].tensor.grad();
  buckets.zero_grad();
  buckets.prepare_backward(true);
  (params[0].tensor * 3).sum().backward();  // only a: b never becomes ready
  buckets.finish_backward();
  buckets.zero_grad();  // rebuilds: a first, then b
  ASSERT_TRUE(buckets.rebuilt());
  EXPECT_EQ(buckets.buckets().front().front(), "a");
  buckets.prepare_backward(true);
  (params[0].tensor * 2).sum().backward();
  buckets.finish_backward();
  EXPECT_TRUE(held.is_same(params[0].tensor.grad()));
  EXPECT_TRUE(torch::allclose(held, torch::full({64}, 2.0f)));
}

}  // namespace
}  // namespace kolos
