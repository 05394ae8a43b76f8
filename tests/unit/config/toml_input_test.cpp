// A run's TOML text into a document (core/src/config/toml_input.cpp):
// toml11's located errors, the checks before it parses (nesting, UTF-8,
// 64-bit integers), `--set` overrides, and loading a file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "config_test_support.h"
#include "kolos/core/run_config.h"

namespace kolos {
namespace {

TEST(RunConfigErrors, MalformedTomlPassesToml11LocationThrough) {
  const std::string msg = parse_error("[model]\nlayers = = 3\n");
  EXPECT_TRUE(has_all(msg, {"run.toml:2:", "malformed TOML", "--> run.toml", "layers = = 3"}));
  EXPECT_TRUE(has_all(parse_error("[model]\nlayers = 3\nlayers = 4\n"),
                      {"run.toml", "malformed TOML", "already exists"}));
  EXPECT_TRUE(has_all(parse_error("[model\n"), {"run.toml:1:", "malformed TOML"}));
}

TEST(RunConfigErrors, DeepNestingIsRefusedBeforeTheParserRecurses) {
  // 200,000 levels crashed the recursive parser (stack overflow).
  const std::string deep(200000, '[');
  EXPECT_TRUE(has_all(parse_error("# a comment\n[model]\nlayers = " + deep + "\n"),
                      {"run.toml:3:", "nested more than 64 deep"}));
  EXPECT_TRUE(has_all(parse_error("[model]\nx = { a = " + std::string(100, '{') + "\n"),
                      {"run.toml:2:", "nested more than 64 deep"}));
  EXPECT_TRUE(has_all(parse_error("[model]\n", {"model.layers=" + deep}),
                      {"--set model.layers=[[[", "nested more than 64 deep"}));
  // Brackets in strings and comments do not count; 64 levels are read.
  const std::string text = "[model]\nname = \"" + deep.substr(0, 500) + "\" # " + deep.substr(0, 500) +
                           "\n[data]\nkind = '''" + deep.substr(0, 500) + "'''\n";
  const std::string strings = parse_error(text);  // refused for the values, not their brackets
  EXPECT_EQ(strings.find("nested"), std::string::npos) << strings;
  std::string nested64 = std::string(64, '[') + "1" + std::string(64, ']');
  const std::string at64 = parse_error("[model]\nlayers = " + nested64 + "\n");
  EXPECT_TRUE(has_all(at64, {"model.layers"})) << "64 levels parse; the value's type is wrong";
  EXPECT_EQ(at64.find("nested"), std::string::npos) << at64;
}

// Bytes that are not UTF-8 are refused before toml11 sees them: its error
// path for one in a literal string read out of bounds.
TEST(RunConfigErrors, BytesThatAreNotUtf8AreRefused) {
  EXPECT_TRUE(has_all(parse_error("[model]\nname = 'g\xbapt'\n"),
                      {"run.toml:2:10: a byte (0xba) that is not UTF-8"}));
  EXPECT_TRUE(has_all(parse_error("# \xc0\xaf overlong\n"), {"run.toml:1:3: a byte (0xc0)"}));
  EXPECT_TRUE(has_all(parse_error("# \xed\xa0\x80 surrogate\n"), {"run.toml:1:3:"}));
  EXPECT_TRUE(has_all(parse_error("", {"model.name='\xff'"}), {"--set model.name=", "not UTF-8"}));
  EXPECT_EQ(parse_run_config("# caf\xc3\xa9 \xf0\x9f\x98\x80\n[model]\nname = \"gpt\"\n", kName)
                .model.name,
            "gpt");
}

// toml11 reads an integer literal past 64 bits as INT64_MAX (or wraps it).
TEST(RunConfigErrors, IntegersPast64BitsAreRefused) {
  for (const char* literal : {"99999999999999999999", "9223372036854775808", "0x8000000000000000",
                              "0o1000000000000000000000"}) {
    EXPECT_TRUE(has_all(parse_error(std::string("[model]\nlayers = ") + literal + "\n"),
                        {"run.toml:2:10:", "does not fit 64 bits"}))
        << literal;
  }
  // toml11's binary parser overflows from the 63rd digit: refused before it runs.
  const std::string binary = "0b" + std::string(63, '1');
  EXPECT_TRUE(has_all(parse_error("[model]\nlayers = " + binary + "\n"),
                      {"run.toml:2:10: a binary integer of 63 digits; kolos reads at most 62"}));
  EXPECT_EQ(parse_run_config("[model]\nlayers = 0b" + std::string(62, '1') + "\n", kName)
                .model.layers,
            (int64_t{1} << 62) - 1);
  EXPECT_EQ(parse_run_config("[train]\nseed = 9_223_372_036_854_775_807\n", kName).train.seed,
            std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(has_all(parse_error("[optim]\nwarmup_steps = -9223372036854775809\n"),
                      {"run.toml:2:16:", "does not fit 64 bits"}));
  EXPECT_TRUE(has_all(parse_error("", {"model.layers=99999999999999999999"}),
                      {"run.toml: --set model.layers=99999999999999999999:", "does not fit"}));
  // A hint past INT64_MAX is left out rather than wrapped to a negative size.
  const std::string hint = parse_error("[model]\nhidden = 9223372036854775807\nheads = 2\n");
  EXPECT_TRUE(has_all(hint, {"e.g. hidden = 9223372036854775806)"}));
  EXPECT_EQ(hint.find("-9223372036854775808"), std::string::npos) << hint;
}

TEST(RunConfigOverrides, ApplyBeforeValidation) {
  const RunConfig c = parse_run_config(
      kFullConfig, kName,
      {"parallel.tensor.size=9", "parallel.tensor.mode=3d", "parallel.tensor.size=8",
       "plugins.layers=tp3d", "model.name=custom", "optim.lr=0.01", "plugins.path=[\"a\", \"b\"]",
       "log.metrics=", "train.seed = 9"});
  EXPECT_EQ(c.parallel.tensor.size, 8);  // the later override wins
  EXPECT_EQ(c.parallel.tensor.mode, "3d");
  EXPECT_EQ(c.model.name, "custom");  // a bare word is a string
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.01);
  EXPECT_EQ(c.plugins.path, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.log.metrics, "");
  EXPECT_EQ(c.plugins.by_role.at("layers"), "tp3d");
  EXPECT_EQ(c.plugins.by_role.at("gradients"), "zero2");  // untouched
  EXPECT_EQ(c.train.seed, 9);
}

TEST(RunConfigOverrides, CreateSectionsAndRefineShorthands) {
  const RunConfig c = parse_run_config("[parallel]\ntensor = 4\nzero = 1\n", kName,
                                       {"parallel.tensor.mode=2d", "parallel.zero.stage=3",
                                        "parallel.pipeline=2", "model.layers=6"});
  EXPECT_EQ(c.parallel.tensor.size, 4);
  EXPECT_EQ(c.parallel.tensor.mode, "2d");
  EXPECT_EQ(c.parallel.zero.stage, 3);
  EXPECT_EQ(c.parallel.pipeline.size, 2);
  EXPECT_EQ(c.model.layers, 6);
  const RunConfig t =
      parse_run_config("", kName, {"parallel.tensor={size=8, mode=\"2.5d\", depth=2}"});
  int64_t depth = 0;
  EXPECT_TRUE(t.section("parallel.tensor").read("depth", depth));
  EXPECT_EQ(depth, 2);
}

TEST(RunConfigOverrides, TypoInOverrideNamesTheOverride) {
  const std::string msg = parse_error("[parallel]\ndata = 2\n", {"parallel.tensr.size=2"});
  EXPECT_TRUE(has_all(msg, {"--set parallel.tensr.size=2", "unknown key `parallel.tensr`",
                            "Did you mean `tensor`?"}));
  EXPECT_EQ(msg.find("run.toml:2"), std::string::npos) << "no file line for an override:\n" << msg;
  EXPECT_TRUE(
      has_all(parse_error("", {"modle.layers=3"}),
              {"--set modle.layers=3", "unknown section `modle`", "Did you mean `model`?"}));
}

TEST(RunConfigOverrides, BadOverrideValuesNameTheOverride) {
  EXPECT_TRUE(has_all(parse_error("[model]\nlayers = 4\n", {"model.layers=2.5"}),
                      {"run.toml: --set model.layers=2.5", "model.layers",
                       "expected an integer, found a float (2.5)"}));
  EXPECT_TRUE(has_all(parse_error("[model]\nlayers = 4\n", {"model.layers=0"}),
                      {"--set model.layers=0", "model.layers", ">= 1"}));
  EXPECT_TRUE(has_all(parse_error("", {"parallel.tensor.mode=2.5"}),
                      {"--set parallel.tensor.mode=2.5", "expected a string, found a float"}));
  // A problem that the override did not cause still points into the file.
  const std::string msg =
      parse_error("[parallel]\ntensor = { size = 4, mode = \"4d\" }\n", {"parallel.tensor.size=2"});
  EXPECT_TRUE(has_all(msg, {"run.toml:2:29", "parallel.tensor.mode"}));
}

TEST(RunConfigOverrides, MalformedOverrides) {
  EXPECT_TRUE(has_all(parse_error("", {"model.layers"}),
                      {"--set model.layers", "expected section.key=value", "no '='"}));
  EXPECT_TRUE(
      has_all(parse_error("", {"model..layers=2"}), {"--set model..layers=2", "not a valid key"}));
  EXPECT_TRUE(has_all(parse_error("", {"=2"}), {"--set =2", "not a valid key"}));
  EXPECT_TRUE(has_all(parse_error("[model]\nname = \"gpt\"\n", {"model.name.first=x"}),
                      {"--set model.name.first=x", "`model.name` is a string", "not a table"}));
  EXPECT_TRUE(
      has_all(parse_error("", {"model.name.first=x"}),
              {"--set model.name.first=x", "model.name: expected a string, found a table"}));
}

TEST(RunConfigOverrides, ValuesThatAreNotTomlBecomeStrings) {
  // "1 2" is not a TOML value; a newline must not smuggle in another key.
  const RunConfig c =
      parse_run_config("", kName, {"model.name=1 2", "log.metrics=a\nmodel.layers = 9"});
  EXPECT_EQ(c.model.name, "1 2");
  EXPECT_EQ(c.log.metrics, "a\nmodel.layers = 9");
  EXPECT_EQ(c.model.layers, 2);
}

class TempDir : public ::testing::Test {
 protected:
  std::string path(const std::string& name) {
    return std::string(KOLOS_CONFIG_TEST_TMPDIR) + "/" + name;
  }
};

TEST_F(TempDir, LoadReadsFileAndRecordsSource) {
  const std::string file = path("load_ok.toml");
  std::ofstream(file) << "[model]\nlayers = 3\n";
  const RunConfig c = load_run_config(file, {"model.hidden=32"});
  EXPECT_EQ(c.source, file);
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.model.hidden, 32);
  std::remove(file.c_str());
}

TEST_F(TempDir, LoadErrorsNameThePathAndLine) {
  const std::string file = path("load_bad.toml");
  std::ofstream(file) << "[model]\n\nlayers = \"x\"\n";
  EXPECT_TRUE(has_all(error_of([&] { load_run_config(file); }),
                      {file + ":3:10", "model.layers", "expected an integer"}));
  std::remove(file.c_str());
}

TEST_F(TempDir, MissingOrUnreadableFileNamesPathAndOsError) {
  const std::string missing = path("no_such_config.toml");
  EXPECT_TRUE(has_all(error_of([&] { load_run_config(missing); }),
                      {missing, "cannot open", "No such file or directory"}));
  EXPECT_TRUE(has_all(error_of([&] { load_run_config(KOLOS_CONFIG_TEST_TMPDIR); }),
                      {KOLOS_CONFIG_TEST_TMPDIR, "Is a directory"}));
}

}  // namespace
}  // namespace kolos
