// The mesh a run's [parallel] sizes make on N ranks (resolve_mesh_shape,
// core/src/mesh/mesh_shape.cpp): data derived or checked, sizes that do not
// divide, products that overflow.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "config_test_support.h"
#include "kolos/core/run_config.h"

namespace kolos {
namespace {

RunConfig mesh_config(int64_t data, int64_t pp, int64_t sp, int64_t tp) {
  RunConfig c;
  c.source = kName;
  c.parallel.data = data;
  c.parallel.pipeline.size = pp;
  c.parallel.sequence.size = sp;
  c.parallel.tensor.size = tp;
  return c;
}

TEST(MeshShape, DerivesDataFromTheWorld) {
  const MeshShape m = resolve_mesh_shape(mesh_config(0, 2, 1, 2), 8);
  EXPECT_EQ(m.pp, 2);
  EXPECT_EQ(m.dp, 2);
  EXPECT_EQ(m.sp, 1);
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(resolve_mesh_shape(RunConfig{}, 1).size(), 1);
  EXPECT_EQ(resolve_mesh_shape(RunConfig{}, 4).dp, 4);
}

TEST(MeshShape, ExplicitDataMustMatch) {
  const MeshShape m = resolve_mesh_shape(mesh_config(2, 1, 2, 2), 8);
  EXPECT_EQ(m.dp, 2);
  EXPECT_EQ(m.sp, 2);
  const std::string msg = error_of([] { resolve_mesh_shape(mesh_config(2, 1, 1, 4), 4); });
  EXPECT_TRUE(has_all(msg, {"run.toml", "pipeline 1 x data 2 x sequence 1 x tensor 4 = 8",
                            "world size is 4", "set parallel.data = 1", "launch 8 ranks"}));
  const std::string odd = error_of([] { resolve_mesh_shape(mesh_config(2, 1, 1, 4), 6); });
  EXPECT_TRUE(has_all(odd, {"= 8", "world size is 6", "launch 8 ranks", "divides 6"}));
}

TEST(MeshShape, SizesThatDoNotDivideTheWorld) {
  const std::string msg = error_of([] { resolve_mesh_shape(mesh_config(0, 1, 1, 3), 8); });
  EXPECT_TRUE(has_all(msg, {"pipeline 1 x sequence 1 x tensor 3 = 3", "does not divide",
                            "world size 8", "launch a multiple of 3", "6 or 9"}));
  const std::string small = error_of([] { resolve_mesh_shape(mesh_config(0, 2, 1, 4), 4); });
  EXPECT_TRUE(has_all(small, {"= 8 does not divide the world size 4", "e.g. 8)"}));
  EXPECT_TRUE(has_all(error_of([] { resolve_mesh_shape(RunConfig{}, 0); }), {"world size"}));
}

// Sizes whose product passes 2^63 used to wrap to 0 and divide by it (SIGFPE).
TEST(MeshShape, ProductsThatOverflowAreRefused) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_TRUE(has_all(error_of([&] { resolve_mesh_shape(mesh_config(0, big, 1, big), 4); }),
                      {"pipeline 4294967296 x sequence 1 x tensor 4294967296", "2^63"}));
  EXPECT_TRUE(has_all(error_of([&] { resolve_mesh_shape(mesh_config(big * 4, 1, 1, big), 4); }),
                      {"= more than 2^63", "world size is 4"}));
  EXPECT_TRUE(has_all(parse_error("[parallel]\npipeline = 4294967296\ntensor = 4294967296\n"),
                      {"run.toml:2:12:", "needs more than 2147483647 ranks"}));
  EXPECT_TRUE(has_all(parse_error("[parallel]\ndata = 65536\ntensor = 65536\n"),
                      {"run.toml:3:10:", "needs more than 2147483647 ranks"}));
}

}  // namespace
}  // namespace kolos
