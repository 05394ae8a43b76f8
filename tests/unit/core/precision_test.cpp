// Mixed precision's local pieces: AdamW's fp32 masters for bf16/fp16
// parameters, the loss scaler's rule, and the start-up probe of what this
// LibTorch can run on the CPU. (The runs on MPI ranks: tests/mpi/precision.)
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <string>

#include "kolos/core/error.h"
#include "kolos/core/optimizer.h"
#include "kolos/core/precision.h"
#include "kolos/core/run_config.h"

namespace kolos {
namespace {

// Whether this LibTorch multiplies fp16 matrices on the CPU (2.x does).
bool cpu_has_fp16_matmul() {
  try {
    const at::Tensor x = torch::ones({2, 2}, torch::kHalf);
    (void)torch::matmul(x, x);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Updates far below the low type's rounding step accumulate in the master
// and reach the parameter; without a master they would all round away.
// `spacing`: the distance from 1 to the next value below it in `dtype`.
void expect_master_accumulates(at::ScalarType dtype, double spacing) {
  for (bool fused : {true, false}) {
    SCOPED_TRACE(std::string(fused ? "fused" : "LibTorch ops") + " " + c10::toString(dtype));
    AdamWSettings s{1e-4, 0.9, 0.95, 1e-8, 0.0, fused};
    at::Tensor param = torch::ones({33}, dtype);  // not a multiple of any vector width
    at::Tensor grad = torch::ones({33}, dtype);
    AdamW adamw(s);
    adamw.add("w", param, grad, Placement::replicated({33}));
    const at::Tensor master = adamw.master_of(param);
    ASSERT_TRUE(master.defined());
    EXPECT_EQ(master.scalar_type(), at::kFloat);
    EXPECT_EQ(adamw.master_bytes(), 33 * 4);
    for (const auto& piece : adamw.state_pieces()) EXPECT_EQ(piece.tensor.scalar_type(), at::kFloat);
    // Each step moves the weight by lr (Adam's normalised step with a
    // constant gradient): less than half the step between 1 and the next
    // value below it, so a bf16 weight updated in place would stay at 1.
    ASSERT_LT(s.lr, spacing / 2);
    for (int i = 0; i < 20; ++i) adamw.step(s.lr);
    EXPECT_NEAR(master[0].item<double>(), 1 - 20 * s.lr, 1e-5);
    EXPECT_TRUE(torch::equal(param, master.to(dtype))) << "the parameter is the master rounded";
    EXPECT_LT(param[0].item<double>(), 1.0);
    // After a checkpoint writes the masters, the parameters follow them.
    master.fill_(0.5);
    adamw.copy_masters_to_params();
    EXPECT_EQ(param[32].item<double>(), 0.5);
  }
}

TEST(AdamWMasters, Bf16ParametersStepThroughFp32Masters) {
  expect_master_accumulates(at::kBFloat16, 1.0 / 256);  // 8 significant bits: 2^-8 below 1
}

TEST(AdamWMasters, Fp16ParametersStepThroughFp32Masters) {
  expect_master_accumulates(at::kHalf, 1.0 / 2048);  // 11 significant bits: 2^-11 below 1
}

TEST(AdamWMasters, Fp32ParametersHaveNone) {
  at::Tensor param = torch::ones({4});
  AdamW adamw(AdamWSettings{});
  adamw.add("w", param, torch::zeros({4}), Placement::replicated({4}));
  EXPECT_FALSE(adamw.master_of(param).defined());
  EXPECT_EQ(adamw.master_bytes(), 0);
}

TEST(LossScaler, GrowsAfterTheIntervalAndHalvesOnOverflow) {
  LossScaler scaler(1024, 2);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 1024);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 2048);
  scaler.update(false);
  EXPECT_EQ(scaler.good_steps(), 1);
  scaler.update(true);  // an overflow also restarts the count
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_EQ(scaler.good_steps(), 0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 1024);
}

TEST(PrecisionProbe, Fp16IsRefusedAtStartWhereLibTorchCannotRunIt) {
  const RunConfig fp16 =
      parse_run_config("[train]\nprecision = \"fp16\"\n", "run.toml");
  if (cpu_has_fp16_matmul()) {
    EXPECT_NO_THROW(check_precision_runs(fp16)) << "LibTorch " TORCH_VERSION;
    return;
  }
  try {
    check_precision_runs(fp16);
    FAIL() << "fp16 accepted on LibTorch " TORCH_VERSION ", which has no fp16 CPU matmul";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    for (const std::string part :
         {"run.toml:2:13", "train.precision", "LibTorch " TORCH_VERSION, "cannot run matmul",
          "in fp16 on the CPU", "\"bf16\" or \"fp32\"", "LibTorch 2.x"}) {
      EXPECT_NE(what.find(part), std::string::npos) << part << " missing from: " << what;
    }
  }
}

TEST(PrecisionProbe, Bf16AndFp32Run) {
  EXPECT_NO_THROW(check_precision_runs(parse_run_config("[train]\nprecision = \"bf16\"\n", "r")));
  EXPECT_NO_THROW(check_precision_runs(parse_run_config("", "r")));
}

}  // namespace
}  // namespace kolos
