// RunConfig: parsing, defaults, shorthands, error messages, the roles,
// closest_match and the to_toml round trip (the text's checks and overrides:
// toml_input_test.cpp; the mesh: mesh_shape_test.cpp).
//
// Error tests check the message, not just the exception type: a config error
// is only useful if it says where, which key, what was found and what would be
// valid.
#include "kolos/core/run_config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "config_test_support.h"
#include "kolos/core/error.h"
#include "kolos/core/roles.h"

namespace kolos {
namespace {

TEST(RunConfigDefaults, EmptyTextGivesTheHeaderDefaults) {
  const RunConfig c = parse_run_config("", "<string>");
  const RunConfig d;
  EXPECT_EQ(c.source, "<string>");
  EXPECT_EQ(c.model.name, d.model.name);
  EXPECT_EQ(c.model.layers, 2);
  EXPECT_EQ(c.model.hidden, 64);
  EXPECT_EQ(c.model.heads, 4);
  EXPECT_DOUBLE_EQ(c.model.init_std, 0.02);
  EXPECT_EQ(c.data.kind, "synthetic");
  EXPECT_EQ(c.data.dtype, "uint16");
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_EQ(c.train.global_batch, 8);
  EXPECT_EQ(c.train.micro_batch, 4);
  EXPECT_EQ(c.train.seed, 1234u);
  EXPECT_EQ(c.train.precision, "fp32");
  EXPECT_EQ(c.parallel.data, 0);
  EXPECT_EQ(c.parallel.tensor.size, 1);
  EXPECT_EQ(c.parallel.tensor.mode, "1d");
  EXPECT_EQ(c.parallel.zero.stage, 0);
  EXPECT_EQ(c.parallel.bucket_mb, 25);
  EXPECT_EQ(c.log.progress, "auto");
  EXPECT_EQ(c.log.every, 1);
  EXPECT_TRUE(c.plugins.path.empty());
  EXPECT_TRUE(c.plugins.by_role.empty());
}

TEST(RunConfigParse, ReadsEveryKey) {
  const RunConfig c = parse_run_config(kFullConfig, kName);
  EXPECT_EQ(c.source, kName);
  EXPECT_EQ(c.model.layers, 12);
  EXPECT_EQ(c.model.hidden, 768);
  EXPECT_EQ(c.model.vocab, 50304);
  EXPECT_DOUBLE_EQ(c.model.init_std, 0.01);
  EXPECT_EQ(c.data.kind, "tokens");
  EXPECT_EQ(c.data.path, "data/train.bin");
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 3e-5);
  EXPECT_EQ(c.optim.warmup_steps, 100);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 1.0);  // an integer where a float is expected
  EXPECT_FALSE(c.optim.fused);
  EXPECT_EQ(c.train.global_batch, 64);
  EXPECT_EQ(c.train.seed, 7);
  EXPECT_EQ(c.train.precision, "fp32");
  EXPECT_EQ(c.parallel.data, 2);
  EXPECT_EQ(c.parallel.tensor.size, 4);
  EXPECT_EQ(c.parallel.tensor.mode, "2d");
  EXPECT_EQ(c.parallel.pipeline.size, 2);
  // The pipeline plugin's keys stay in the document, for the plugin to read.
  const ConfigSection pipeline = c.section("parallel.pipeline");
  std::string schedule;
  int64_t microbatches = 0, chunks = 0;
  EXPECT_TRUE(pipeline.read("schedule", schedule));
  EXPECT_TRUE(pipeline.read("microbatches", microbatches));
  EXPECT_TRUE(pipeline.read("chunks", chunks));
  EXPECT_EQ(schedule, "interleaved");
  EXPECT_EQ(microbatches, 8);
  EXPECT_EQ(chunks, 2);
  EXPECT_EQ(pipeline.keys(),
            (std::vector<std::string>{"size", "schedule", "microbatches", "chunks"}));
  EXPECT_EQ(c.parallel.zero.stage, 2);
  EXPECT_EQ(c.parallel.bucket_mb, 50);
  EXPECT_EQ(c.parallel.bucket_kb, 512);
  EXPECT_EQ(c.log.metrics, "metrics.jsonl");
  EXPECT_EQ(c.log.every, 10);
  EXPECT_EQ(c.log.progress, "lines");
  EXPECT_EQ(c.plugins.path, (std::vector<std::string>{"build/plugins", "/opt/kolos/plugins"}));
  EXPECT_EQ(c.plugins.by_role,
            (std::map<std::string, std::string>{{"layers", "tp2d"}, {"gradients", "zero2"}}));
}

TEST(RunConfigParse, RuntimeDevice) {
  EXPECT_EQ(parse_run_config("", kName).runtime.device, "cpu");
  EXPECT_EQ(parse_run_config("[runtime]\ndevice = \"cuda\"\n", kName).runtime.device, "cuda");
  try {
    parse_run_config("[runtime]\ndevice = \"gpu\"\n", kName);
    FAIL() << "device = \"gpu\" was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"gpu\" is not a valid device; valid: \"cpu\", \"cuda\""),
              std::string::npos)
        << e.what();
  }
}

TEST(RunConfigParse, SubTableSectionsWork) {
  const RunConfig c = parse_run_config(
      "[parallel.tensor]\nsize = 8\nmode = \"2.5d\"\ndepth = 2\n[parallel.zero]\nstage = 3\n",
      kName);
  EXPECT_EQ(c.parallel.tensor.size, 8);
  EXPECT_EQ(c.parallel.tensor.mode, "2.5d");
  int64_t depth = 0;
  EXPECT_TRUE(c.section("parallel.tensor").read("depth", depth));  // tp2p5d's key
  EXPECT_EQ(depth, 2);
  EXPECT_EQ(c.parallel.zero.stage, 3);
}

TEST(RunConfigShorthand, IntegerStandsForSizeOrStage) {
  const RunConfig c =
      parse_run_config("[parallel]\ntensor = 4\npipeline = 2\nsequence = 1\nzero = 2\n", kName);
  EXPECT_EQ(c.parallel.tensor.size, 4);
  EXPECT_EQ(c.parallel.tensor.mode, "1d");
  EXPECT_EQ(c.parallel.pipeline.size, 2);
  EXPECT_EQ(c.parallel.sequence.size, 1);
  EXPECT_EQ(c.parallel.zero.stage, 2);
}

TEST(RunConfigShorthand, WrongTypeSaysBothFormsAreAccepted) {
  EXPECT_TRUE(has_all(parse_error("[parallel]\ntensor = \"4\"\n"),
                      {"run.toml:2:10", "parallel.tensor", "expected an integer or a table",
                       "found a string (\"4\")"}));
  EXPECT_TRUE(has_all(parse_error("[parallel]\nzero = 5\n"),
                      {"run.toml:2:8", "parallel.zero", "5 is not a ZeRO stage", "valid: 0"}));
  EXPECT_TRUE(has_all(parse_error("[parallel]\npipeline = 0\n"),
                      {"run.toml:2:12", "parallel.pipeline", "must be >= 1"}));
}

TEST(RunConfigErrors, UnknownSectionListsSectionsAndSuggests) {
  const std::string msg = parse_error("[model]\nlayers = 2\n\n[modle]\nhidden = 8\n");
  EXPECT_TRUE(has_all(msg, {"run.toml:4:", "unknown section `modle`", "valid sections",
                            "model, data, optim, train, parallel, log, checkpoint, runtime, plugins",
                            "Did you mean `model`?"}));
  // No suggestion for something unrelated.
  const std::string far = parse_error("[snapshots]\ndir = \"ckpt\"\n");
  EXPECT_TRUE(has_all(far, {"unknown section `snapshots`"}));
  EXPECT_EQ(far.find("Did you mean"), std::string::npos) << far;
}

TEST(RunConfigCheckpoint, ReadsTheSectionAndChecksIt) {
  const RunConfig c = parse_run_config(
      "[checkpoint]\ndir = \"ckpt\"\nevery = 50\nkeep_last = 3\nasync = true\n", "run.toml");
  EXPECT_EQ(c.checkpoint.dir, "ckpt");
  EXPECT_EQ(c.checkpoint.every, 50);
  EXPECT_EQ(c.checkpoint.keep_last, 3);
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_EQ(RunConfig{}.checkpoint.dir, "");  // off by default
  EXPECT_TRUE(has_all(parse_error("[checkpoint]\ndir = \"c\"\nevry = 5\n"),
                      {"run.toml:3:", "unknown key `checkpoint.evry`", "Did you mean `every`?"}));
  EXPECT_TRUE(has_all(parse_error("[checkpoint]\ndir = \"c\"\nevery = -1\n"),
                      {"run.toml:3:", "checkpoint.every"}));
  EXPECT_TRUE(has_all(parse_error("[checkpoint]\ndir = \"c\"\nasync = 1\n"),
                      {"run.toml:3:", "checkpoint.async", "true or false"}));
  EXPECT_TRUE(
      has_all(parse_error("[checkpoint]\nevery = 5\n"), {"run.toml:2:", "[checkpoint] needs dir"}));
}

TEST(RunConfigErrors, UnknownKeyNamesLineColumnKeyAndSuggestion) {
  const std::string msg = parse_error("[model]\nlayers = 2\nhiden = 64\n");
  EXPECT_TRUE(has_all(msg, {"run.toml:3:1: ", "unknown key `model.hiden`",
                            "valid keys in [model]: name, layers, hidden", "Did you mean `hidden`?",
                            " 3 | hiden = 64", "^~~~~"}));
}

TEST(RunConfigErrors, UnknownKeyInInlineTablePointsAtTheKey) {
  // At size 1 no sequence plugin runs: the core refuses the table's other
  // keys (a plugin's own keys are checked by the plugin).
  const std::string msg = parse_error("[parallel]\nsequence = { size = 1, szie = 2 }\n");
  EXPECT_TRUE(
      has_all(msg, {"run.toml:2:24: ", "unknown key `parallel.sequence.szie`",
                    "valid keys in [parallel.sequence] (no sequence plugin runs): size, mode",
                    "Did you mean `size`?"}));
}

TEST(RunConfigErrors, TheFirstUnknownKeyInFileOrderIsReported) {
  const std::string msg = parse_error("[train]\nsetps = 3\nsed = 1\nmicro_bach = 2\n");
  EXPECT_TRUE(has_all(msg, {"run.toml:2:1", "train.setps", "Did you mean `steps`?"}));
}

TEST(RunConfigErrors, WrongTypeSaysExpectedAndFound) {
  EXPECT_TRUE(has_all(
      parse_error("[model]\nlayers = \"two\"\n"),
      {"run.toml:2:10: model.layers: expected an integer, found a string (\"two\")", "^~~~~"}));
  EXPECT_TRUE(
      has_all(parse_error("[model]\nlayers = 2.5\n"),
              {"run.toml:2:10", "model.layers", "expected an integer, found a float (2.5)"}));
  EXPECT_TRUE(has_all(parse_error("[optim]\nlr = \"fast\"\n"),
                      {"run.toml:2:6", "optim.lr", "expected a number, found a string"}));
  EXPECT_TRUE(has_all(parse_error("[data]\nkind = 3\n"),
                      {"run.toml:2:8", "data.kind", "expected a string, found an integer (3)"}));
  EXPECT_TRUE(has_all(parse_error("model = 3\n"),
                      {"run.toml:1:9", "model: expected a table", "found an integer (3)"}));
  EXPECT_TRUE(has_all(parse_error("[plugins]\npath = \"lib\"\n"),
                      {"run.toml:2:8", "plugins.path", "expected an array of strings"}));
  EXPECT_TRUE(has_all(parse_error("[plugins]\npath = [\"a\", 1]\n"),
                      {"run.toml:2", "plugins.path", "an element that is an integer (1)"}));
}

TEST(RunConfigErrors, IntegerWhereFloatIsExpectedIsFine) {
  const RunConfig c =
      parse_run_config("[optim]\nlr = 1\nbeta1 = 0\n[model]\ninit_std = 1\n", kName);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.0);
  EXPECT_DOUBLE_EQ(c.optim.beta1, 0.0);
  EXPECT_DOUBLE_EQ(c.model.init_std, 1.0);
}

struct RangeCase {
  std::string toml;
  std::vector<std::string> expected;
};

TEST(RunConfigErrors, OutOfRangeValuesNameKeyValueAndRule) {
  const std::vector<RangeCase> cases = {
      {"[model]\nlayers = 0\n", {"run.toml:2:10", "model.layers", "0 is out of range", ">= 1"}},
      {"[model]\nseq_len = -1\n", {"run.toml:2", "model.seq_len", "-1", ">= 1"}},
      {"[model]\nvocab = 1\n", {"run.toml:2", "model.vocab", ">= 2"}},
      {"[model]\nname = \"\"\n", {"run.toml:2", "model.name", "must not be empty"}},
      {"[model]\ninit_std = 0\n", {"model.init_std", "> 0"}},
      {"[optim]\nlr = 0\n", {"run.toml:2:6", "optim.lr", "0.0 is out of range", "> 0"}},
      {"[optim]\nlr = 1e-3\nmin_lr = 1e-2\n", {"run.toml:3", "optim.min_lr", "[0, optim.lr"}},
      {"[optim]\nbeta1 = 1.0\n", {"optim.beta1", "1.0 is out of range", "must be in [0, 1)"}},
      {"[optim]\nbeta2 = -0.1\n", {"optim.beta2", "must be in [0, 1)"}},
      {"[optim]\neps = 0\n", {"optim.eps", "> 0"}},
      {"[optim]\nweight_decay = -1\n", {"optim.weight_decay", ">= 0"}},
      {"[optim]\ngrad_clip = -1\n", {"optim.grad_clip", "0 disables"}},
      {"[optim]\nfused = 1\n", {"run.toml:2", "optim.fused", "true or false"}},
      {"[optim]\nwarmup_steps = -5\n", {"optim.warmup_steps", ">= 0"}},
      {"[train]\nmicro_batch = 0\n", {"run.toml:2", "train.micro_batch", ">= 1"}},
      {"[train]\nsteps = 0\n", {"train.steps", ">= 1"}},
      {"[train]\nseed = -1\n", {"train.seed", ">= 0"}},
      {"[parallel]\ndata = -1\n", {"parallel.data", ">= 0"}},
      {"[parallel]\ntensor = { size = 0 }\n", {"run.toml:2:19", "parallel.tensor.size", ">= 1"}},
      {"[parallel]\nsequence = { size = -2 }\n", {"parallel.sequence.size", ">= 1"}},
      {"[parallel]\nzero = { stage = 4 }\n",
       {"run.toml:2:18", "parallel.zero.stage", "valid: 0 (off)"}},
      {"[parallel]\nbucket_mb = 0\n", {"parallel.bucket_mb", ">= 1"}},
      {"[log]\nevery = 0\n", {"log.every", ">= 1"}},
      {"[plugins]\nlayers = \"\"\n", {"plugins.layers", "must name a plugin"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.toml);
    EXPECT_TRUE(has_all(parse_error(c.toml), c.expected));
  }
}

TEST(RunConfigErrors, ZeroStageMessageListsTheStages) {
  EXPECT_TRUE(has_all(parse_error("[parallel]\nzero = { stage = 4 }\n"),
                      {"4 is not a ZeRO stage", "valid: 0 (off), 1", "3 (+ parameters)"}));
}

TEST(RunConfigErrors, HiddenNotDivisibleByHeadsNamesBothNumbers) {
  const std::string msg = parse_error("[model]\nhidden = 100\nheads = 12\n");
  EXPECT_TRUE(has_all(msg, {"run.toml:2:10", "model.hidden = 100",
                            "not divisible by model.heads = 12", "96 or 108"}));
}

TEST(RunConfigErrors, GlobalBatchNotDivisibleByMicroBatch) {
  const std::string msg = parse_error("[train]\nglobal_batch = 10\nmicro_batch = 4\n");
  EXPECT_TRUE(has_all(msg, {"run.toml:2", "train.global_batch = 10",
                            "not divisible by train.micro_batch = 4", "8 or 12"}));
}

TEST(RunConfigErrors, TokensNeedPathAndAWideEnoughDtype) {
  EXPECT_TRUE(has_all(parse_error("[data]\nkind = \"tokens\"\n"),
                      {"run.toml:2:8", "data.path: required when data.kind = \"tokens\""}));
  EXPECT_TRUE(
      has_all(parse_error("[model]\nvocab = 100000\n[data]\nkind = \"tokens\"\npath = \"t.bin\"\n"),
              {"run.toml:2", "uint16", "model.vocab = 100000", "dtype = \"uint32\""}));
  const RunConfig ok = parse_run_config(
      "[model]\nvocab = 100000\n[data]\nkind = \"tokens\"\npath = \"t.bin\"\ndtype = \"uint32\"\n",
      kName);
  EXPECT_EQ(ok.data.dtype, "uint32");
  // Synthetic data ignores dtype, so a big vocab is fine there.
  EXPECT_EQ(parse_run_config("[model]\nvocab = 100000\n", kName).model.vocab, 100000);
}

TEST(RunConfigErrors, EnumeratedStringsListValidValuesAndSuggest) {
  const std::vector<RangeCase> cases = {
      {"[train]\nprecision = \"fp31\"\n",
       {"run.toml:2:13", "train.precision", "\"fp31\" is not a valid precision",
        "valid: \"fp32\", \"bf16\", \"fp16\"",
        "Did you mean \"fp32\"?"}},
      {"[data]\nkind = \"token\"\n", {"data.kind", "Did you mean \"tokens\"?"}},
      {"[data]\ndtype = \"uint8\"\n", {"data.dtype", "\"uint16\", \"uint32\""}},
      {"[parallel]\ntensor = { size = 4, mode = \"2D\" }\n",
       {"run.toml:2:29", "parallel.tensor.mode", "valid: \"1d\", \"2d\", \"2.5d\", \"3d\"",
        "Did you mean \"2d\"?"}},
      {"[log]\nprogress = \"bars\"\n",
       {"log.progress", "\"auto\", \"bar\", \"lines\", \"off\"", "Did you mean \"bar\"?"}},
      {"[optim]\nname = \"adamw2\"\n", {"optim.name", "Did you mean \"adamw\"?"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.toml);
    EXPECT_TRUE(has_all(parse_error(c.toml), c.expected));
  }
  const std::string far = parse_error("[parallel]\ntensor = { mode = \"4d\" }\n");
  EXPECT_EQ(far.find("Did you mean"), std::string::npos) << far;  // 1d, 2d, 3d tie
}

TEST(RunConfigPrecision, KeysAndTheirRefusals) {
  const RunConfig bf16 = parse_run_config("[train]\nprecision = \"bf16\"\n", kName);
  EXPECT_EQ(bf16.train.precision, "bf16");
  EXPECT_EQ(bf16.train.reduce_dtype, "param");
  const RunConfig fp16 = parse_run_config(
      "[train]\nprecision = \"fp16\"\nreduce_dtype = \"fp32\"\nloss_scale_init = 1024.0\n"
      "loss_scale_growth_interval = 50\n",
      kName);
  EXPECT_EQ(fp16.train.reduce_dtype, "fp32");
  EXPECT_EQ(fp16.train.loss_scale_init, 1024.0);
  EXPECT_EQ(fp16.train.loss_scale_growth_interval, 50);
  // The effective config writes the loss-scale keys only for fp16, and reads back.
  const RunConfig again = parse_run_config(to_toml(fp16), kName);
  EXPECT_EQ(again.train.loss_scale_init, 1024.0);
  EXPECT_EQ(again.train.loss_scale_growth_interval, 50);
  EXPECT_EQ(to_toml(bf16).find("loss_scale"), std::string::npos);
  EXPECT_EQ(parse_run_config(to_toml(bf16), kName).train.precision, "bf16");
  // Loss scaling with bf16 or fp32 would do nothing: refused, located.
  EXPECT_TRUE(has_all(parse_error("[train]\nprecision = \"bf16\"\nloss_scale_init = 8.0\n"),
                      {"run.toml:3:19", "train.loss_scale_init",
                       "applies to precision = \"fp16\" only", "precision = \"bf16\""}));
  EXPECT_TRUE(has_all(parse_error("", {"train.loss_scale_growth_interval=10"}),
                      {"--set train.loss_scale_growth_interval=10",
                       "applies to precision = \"fp16\" only", "\"fp32\""}));
  EXPECT_TRUE(has_all(parse_error("[train]\nprecision = \"fp16\"\nloss_scale_init = 0.5\n"),
                      {"train.loss_scale_init", "0.5 is out of range", ">= 1"}));
  EXPECT_TRUE(has_all(parse_error("[train]\nreduce_dtype = \"bf16\"\n"),
                      {"train.reduce_dtype", "not a valid gradient reduction dtype",
                       "\"param\", \"fp32\""}));
}

TEST(RunConfigErrors, UnknownPluginRole) {
  const std::string msg = parse_error("[plugins]\nlayer = \"tp2d\"\n");
  EXPECT_TRUE(has_all(msg, {"run.toml:2:1", "unknown key `plugins.layer`",
                            "valid keys in [plugins] (path and the roles): path, layers, "
                            "sequence, pipeline, gradients, memory, planner",
                            "Did you mean `layers`?"}));
}

TEST(RunConfigRoles, ParallelAutoOrAPlannerSectionAsksForThePlannerRole) {
  EXPECT_EQ(choose_plugins(parse_run_config("", "run.toml")).planner, "");
  const RunConfig automatic = parse_run_config("[parallel]\nauto = true\n", "run.toml");
  EXPECT_TRUE(automatic.parallel.auto_plan);
  EXPECT_EQ(choose_plugins(automatic).planner, "autoplan");
  EXPECT_EQ(choose_plugins(parse_run_config("[planner]\ntop = 3\n", "run.toml")).planner, "autoplan");
  EXPECT_EQ(choose_plugins(parse_run_config("[plugins]\nplanner = \"mine\"\n", "run.toml")).planner,
            "mine");
  EXPECT_TRUE(has_all(parse_error("[parallel]\nauto = 1\n"), {"run.toml:2", "parallel.auto"}));
  // Under auto a mode without a size fixes the planner's mode; without
  // auto it has no effect and is refused.
  EXPECT_EQ(parse_run_config("[parallel]\nauto = true\ntensor = { mode = \"2d\" }\n"
                             "sequence = { mode = \"ring\" }\n",
                             "run.toml")
                .parallel.tensor.mode,
            "2d");
  EXPECT_TRUE(has_all(parse_error("[parallel]\ntensor = { mode = \"2d\" }\n"),
                      {"parallel.tensor.mode", "has no effect"}));
}

TEST(RunConfigRoles, ABadModeIsRefusedAtOnce) {
  EXPECT_TRUE(has_all(parse_error("[parallel]\nsequence = { size = 2, mode = \"ulises\" }\n"),
                      {"parallel.sequence.mode", "ulises", "ulysses"}));
}

TEST(RunConfigRoles, SettingsAndOverridesMustAgree) {
  EXPECT_TRUE(has_all(parse_error("[parallel]\ntensor = { size = 1, mode = \"2d\" }\n"),
                      {"run.toml:2:29", "parallel.tensor.mode", "has no effect",
                       "size = 1 runs the serial layers"}));
  EXPECT_TRUE(has_all(
      parse_error(
          "[parallel]\ntensor = { size = 4, mode = \"2d\" }\n[plugins]\nlayers = \"tp1d\"\n"),
      {"selects the layers plugin `tp2d`", "plugins.layers names `tp1d`", "remove one"}));
  EXPECT_TRUE(has_all(parse_error("[parallel]\nzero = 2\n[plugins]\ngradients = \"dp\"\n"),
                      {"selects the gradients plugin `zero2`", "plugins.gradients names `dp`"}));
  EXPECT_TRUE(has_all(parse_error("[parallel]\nsequence = { size = 1, mode = \"ulysses\" }\n"),
                      {"run.toml:2:31", "parallel.sequence.mode", "has no effect",
                       "parallel.sequence.size = 1 splits no sequence"}));
  EXPECT_TRUE(has_all(
      parse_error("[parallel]\nsequence = { size = 2, mode = \"ulysses\" }\n[plugins]\n"
                  "sequence = \"mysp\"\n"),
      {"selects the sequence plugin `ulysses`", "plugins.sequence names `mysp`", "remove one"}));
  // Agreeing, or an override alone, is fine.
  EXPECT_EQ(parse_run_config("[parallel]\ntensor = { size = 4, mode = \"2d\" }\n[plugins]\n"
                             "layers = \"tp2d\"\n",
                             kName)
                .plugins.by_role.at("layers"),
            "tp2d");
  const RunConfig c =
      parse_run_config("[parallel]\ntensor = 4\n[plugins]\nlayers = \"tp3d\"\n", kName);
  EXPECT_EQ(choose_plugins(c).layers, "tp3d");
}

TEST(RunConfigRoles, ChoosePluginsFollowsTheSettings) {
  const auto choice = [](const std::string& text) {
    return choose_plugins(parse_run_config(text, kName));
  };
  EXPECT_EQ(choice("").layers, "serial");
  EXPECT_EQ(choice("").pipeline, "single-stage");
  EXPECT_EQ(choice("").gradients, "dp");
  EXPECT_EQ(choice("").sequence, "");
  EXPECT_EQ(choice("[parallel]\nsequence = 2\n").sequence, "ulysses");
  EXPECT_EQ(choice("[parallel]\nsequence = { size = 4, mode = \"ulysses\" }\n").sequence,
            "ulysses");
  EXPECT_EQ(choice("[parallel]\nsequence = { size = 4, mode = \"ring\" }\n").sequence, "ring");
  EXPECT_EQ(choice("[parallel]\ntensor = 2\n").layers, "tp1d");
  EXPECT_EQ(choice("[parallel]\ntensor = { size = 4, mode = \"2d\" }\n").layers, "tp2d");
  EXPECT_EQ(choice("[parallel]\ntensor = { size = 8, mode = \"2.5d\" }\n").layers, "tp2p5d");
  EXPECT_EQ(choice("[parallel]\ntensor = { size = 8, mode = \"3d\" }\n").layers, "tp3d");
  EXPECT_EQ(choice("[parallel]\npipeline = 2\n").pipeline, "pipeline");
  for (int stage = 1; stage <= 3; ++stage) {
    EXPECT_EQ(choice("[parallel]\nzero = " + std::to_string(stage) + "\n").gradients,
              "zero" + std::to_string(stage));
  }
  // A [memory] section selects the memory role's plugin; none: no plugin.
  EXPECT_EQ(choice("").memory, "");
  EXPECT_EQ(choice("[memory]\ncompute_budget = \"1GiB\"\n").memory, "chunks");
  EXPECT_EQ(choice("[plugins]\nmemory = \"mychunks\"\n").memory, "mychunks");
}

TEST(ClosestMatch, SuggestsOnlyCloseUnambiguousCandidates) {
  const std::vector<std::string> keys = {"name", "layers", "hidden", "heads", "seq_len", "vocab"};
  EXPECT_EQ(closest_match("hiden", keys), "hidden");
  EXPECT_EQ(closest_match("hidden", keys), "hidden");
  EXPECT_EQ(closest_match("Hidden", keys), "hidden");  // case-insensitive
  EXPECT_EQ(closest_match("lyaers", keys), "layers");  // swapped letters count once
  EXPECT_EQ(closest_match("seqlen", keys), "seq_len");
  EXPECT_EQ(closest_match("completely_different", keys), "");
  EXPECT_EQ(closest_match("x", keys), "");
  EXPECT_EQ(closest_match("anything", {}), "");
  // Threshold grows with length: two edits are fine for a long word, not a short one.
  EXPECT_EQ(closest_match("weight_dcy", {"weight_decay", "warmup_steps"}), "weight_decay");
  EXPECT_EQ(closest_match("hxdxen", {"hidden"}), "hidden");
  EXPECT_EQ(closest_match("hxd", {"hid"}), "hid");
  EXPECT_EQ(closest_match("hxx", {"hid"}), "");
  // Equally close to several: ambiguous, no suggestion.
  EXPECT_EQ(closest_match("4d", {"1d", "2d", "2.5d", "3d"}), "");
  EXPECT_EQ(closest_match("2D", {"1d", "2d", "2.5d", "3d"}), "2d");
}

TEST(ToToml, RoundTripsEveryField) {
  RunConfig c = parse_run_config(kFullConfig, kName);
  c.plugins.path.push_back("with \"quotes\" and \\ back\\slash\tand tab");
  c.model.init_std = 0.1 + 0.2;  // not exactly representable in short decimal
  c.optim.eps = 1e-12;
  const std::string text = to_toml(c);
  const RunConfig back = parse_run_config(text, "<effective>");
  EXPECT_EQ(back.source, "<effective>");
  // Identical apart from the first line, which names the source.
  const auto body = [](const std::string& t) { return t.substr(t.find('\n')); };
  EXPECT_EQ(body(to_toml(back)), body(text));
  EXPECT_EQ(back.model.init_std, c.model.init_std);  // exact, not approximately
  EXPECT_EQ(back.optim.lr, c.optim.lr);
  EXPECT_EQ(back.optim.eps, 1e-12);
  EXPECT_FALSE(back.optim.fused);
  EXPECT_EQ(back.plugins.path, c.plugins.path);
  EXPECT_EQ(back.plugins.by_role, c.plugins.by_role);
  EXPECT_EQ(back.parallel.tensor.mode, "2d");
  EXPECT_EQ(back.section("parallel.pipeline").value_text("chunks"), "2");  // the plugin's, as given
  EXPECT_EQ(back.section("parallel.pipeline").value_text("schedule"), "\"interleaved\"");
  EXPECT_EQ(back.parallel.zero.stage, 2);
  EXPECT_EQ(back.train.seed, 7);
  EXPECT_EQ(back.data.path, "data/train.bin");
}

TEST(ToToml, DefaultsRoundTripAndAreReadable) {
  const RunConfig d;
  const std::string text = to_toml(d);
  EXPECT_TRUE(has_all(text, {"[model]\n", "layers = 2\n", "init_std = 0.02\n", "lr = 0.001\n",
                             "eps = 1e-08\n", "tensor = { size = 1 }", "pipeline = { size = 1 }",
                             "zero = { stage = 0 }", "path = []\n"}));
  EXPECT_EQ(to_toml(parse_run_config(text, "")), to_toml(RunConfig{}));
}

TEST(ToToml, LlamaRoundTripsWithItsResolvedKeysAndNoMlpRatio) {
  const RunConfig c = parse_run_config(
      "[model]\nname = \"llama\"\nhidden = 512\nheads = 8\nrope_theta = 500000.0\n", kName);
  EXPECT_EQ(c.model.kv_heads, 8);       // 0 / absent: heads
  EXPECT_EQ(c.model.ffn_hidden, 1536);  // ceil(8/3 * 512) = 1366, up to a multiple of 256
  EXPECT_DOUBLE_EQ(c.model.norm_eps, 1e-5);
  const std::string text = to_toml(c);
  EXPECT_TRUE(has_all(text, {"kv_heads = 8\n", "rope_theta = 5e+05\n", "ffn_hidden = 1536\n",
                             "norm_eps = 1e-05\n"}));
  EXPECT_EQ(text.find("mlp_ratio"), std::string::npos);
  const auto body = [](const std::string& t) { return t.substr(t.find('\n')); };
  EXPECT_EQ(body(to_toml(parse_run_config(text, "<effective>"))), body(text));
  // GPT's effective configuration is as before: no LLaMA keys.
  EXPECT_EQ(to_toml(RunConfig{}).find("kv_heads"), std::string::npos);
}

TEST(LlamaDefaults, FfnHiddenFollowsLlamasRule) {
  EXPECT_EQ(default_ffn_hidden(4096), 11008);  // LLaMA-7B
  EXPECT_EQ(default_ffn_hidden(5120), 13824);  // LLaMA-13B
  EXPECT_EQ(default_ffn_hidden(64), 192);
  EXPECT_EQ(default_ffn_hidden(32), 96);
  EXPECT_EQ(default_ffn_hidden(std::numeric_limits<int64_t>::max()), 0);
}

}  // namespace
}  // namespace kolos