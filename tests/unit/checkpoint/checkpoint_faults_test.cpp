// Damaged and foreign checkpoints, one process: every failure is a clear
// error naming the file and dataset, and nothing is written into the
// tensors being loaded. Also: the checksum, and the reader's bounds.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../../../checkpoint/src/crc32c.h"
#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/comm/mpi.h"

namespace fs = std::filesystem;

namespace kolos {

// A group over MPI_COMM_SELF: made in main(), released before MPI_Finalize.
comm::ProcessGroupPtr g_self;

namespace {

comm::ProcessGroup& self() { return *g_self; }

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kolos-ckpt-faults-XXXXXX").string();
    root_ = mkdtemp(pattern.data());
    dir_ = root_ + "/step-00000005";
    // A distinctive float pattern, easy to find in the shard's bytes.
    weight_ = torch::arange(256, torch::kFloat).reshape({16, 16}) * 0.5f + 1000.25f;
    bias_ = torch::linspace(-1, 1, 16, torch::kDouble);
    checkpoint::Metadata meta;
    meta.step = 5;
    checkpoint::save_pieces(self(), MeshLayout(MeshShape{}), dir_, pieces(weight_, bias_), meta);
    shard_ = dir_ + "/shard-0.h5";
  }
  void TearDown() override { fs::remove_all(root_); }

  static std::vector<checkpoint::Piece> pieces(const at::Tensor& w, const at::Tensor& b) {
    return {{"model/w", w, Placement::replicated(w.sizes().vec())},
            {"model/b", b, Placement::replicated(b.sizes().vec())}};
  }

  // Loads into sentinel tensors; returns the error ("" on success) and
  // checks that nothing was written on failure.
  std::string load_error(std::vector<int64_t> wshape = {16, 16}) {
    at::Tensor w = torch::full(wshape, -3.0f);
    at::Tensor b = torch::full({16}, -3.0, torch::kDouble);
    try {
      checkpoint::load_pieces(self(), dir_, pieces(w, b));
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCheckpoint);
      EXPECT_TRUE(torch::all(w == -3.0f).item<bool>()) << "tensor written by a failed load";
      EXPECT_TRUE(torch::all(b == -3.0).item<bool>()) << "tensor written by a failed load";
      return e.what();
    }
    return "";
  }

  std::vector<char> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }
  void write_file(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  std::string root_, dir_, shard_;
  at::Tensor weight_, bias_;
};

TEST(Crc32c, KnownValues) {
  using checkpoint::detail::crc32c;
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  std::string a(1000, 'x');
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 31);
  EXPECT_EQ(crc32c(crc32c(0, a.data(), 333), a.data() + 333, 667), crc32c(0, a.data(), 1000));
}

TEST_F(Faults, ASoundCheckpointLoadsAndVerifies) {
  EXPECT_TRUE(checkpoint::verify(dir_).empty());
  at::Tensor w = torch::zeros({16, 16});
  at::Tensor b = torch::zeros({16}, torch::kDouble);
  EXPECT_EQ(checkpoint::load_pieces(self(), dir_, pieces(w, b)).step, 5);
  EXPECT_TRUE(torch::equal(w, weight_));
  EXPECT_TRUE(torch::equal(b, bias_));
}

TEST_F(Faults, BitFlipNamesFileAndDataset) {
  auto bytes = read_file(shard_);
  // The weight's element 10 is 1005.25f; flip one bit of it.
  const float needle = 1005.25f;
  auto it = std::search(bytes.begin(), bytes.end(), reinterpret_cast<const char*>(&needle),
                        reinterpret_cast<const char*>(&needle) + 4);
  ASSERT_NE(it, bytes.end());
  *it ^= 0x01;
  write_file(shard_, bytes);
  const std::string e = load_error();
  EXPECT_TRUE(has(e, shard_) && has(e, "dataset /model/w") && has(e, "checksum mismatch")) << e;
  const auto problems = checkpoint::verify(dir_);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_TRUE(has(problems[0], "/model/w") && has(problems[0], "checksum")) << problems[0];
}

TEST_F(Faults, TruncatedShardNamesTheFile) {
  fs::resize_file(shard_, fs::file_size(shard_) / 2);
  const std::string e = load_error();
  EXPECT_TRUE(has(e, shard_)) << e;
  EXPECT_FALSE(checkpoint::verify(dir_).empty());
}

TEST_F(Faults, MissingShardNamesTheFileAndWhatItHeld) {
  fs::remove(shard_);
  const std::string e = load_error();
  EXPECT_TRUE(has(e, "missing shard " + shard_) && has(e, "/model/")) << e;
  EXPECT_FALSE(checkpoint::verify(dir_).empty());
}

TEST_F(Faults, MissingIndexSaysSo) {
  fs::remove(dir_ + "/index.h5");
  EXPECT_TRUE(has(load_error(), "no checkpoint at " + dir_));
}

TEST_F(Faults, AnotherModelShapeNamesDatasetAndBothShapes) {
  const std::string e = load_error({16, 8});
  EXPECT_TRUE(has(e, dir_ + "/index.h5") && has(e, "dataset /model/w") && has(e, "[16, 16]") &&
              has(e, "[16, 8]"))
      << e;
}

TEST_F(Faults, AnotherModelsTensorsAreNamed) {
  at::Tensor w = torch::zeros({16, 16});
  std::vector<checkpoint::Piece> other = {{"model/w", w, Placement::replicated({16, 16})},
                                          {"model/extra", torch::zeros({3}),
                                           Placement::replicated({3})}};
  try {
    checkpoint::load_pieces(self(), dir_, other);
    FAIL() << "loaded a checkpoint of another model";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "missing dataset /model/extra") &&
                has(e.what(), "dataset /model/b is not in this run"))
        << e.what();
  }
}

TEST_F(Faults, TheReaderBoundsSizesBeforeAllocating) {
  // Replace the shard's /model/b by a dataset that claims 2^40 doubles (the
  // file holds a few KiB): verification must refuse it from its extents,
  // never try to read or allocate it.
  hid_t f = H5Fopen(shard_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/model/b", H5P_DEFAULT), 0);
  hsize_t huge = hsize_t{1} << 40;
  hid_t space = H5Screate_simple(1, &huge, nullptr);
  hid_t ds = H5Dcreate2(f, "/model/b", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  hid_t s1 = H5Screate(H5S_SCALAR);
  hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, 7);
  hid_t a = H5Acreate2(ds, "kolos.dtype", str, s1, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, str, "float64");
  H5Aclose(a);
  H5Tclose(str);
  H5Sclose(s1);
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(f);
  const std::string e = load_error();
  EXPECT_TRUE(has(e, shard_) && has(e, "/model/b") && has(e, "exceed")) << e;
}

// Rewrites index.h5's mesh attributes as a writer with other axes would.
void rewrite_mesh(const std::string& index, const std::vector<int64_t>& sizes,
                  const std::string& names, int64_t world_size) {
  hid_t f = H5Fopen(index.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  for (const char* name : {"mesh", "mesh_axes", "world_size"}) ASSERT_GE(H5Adelete(f, name), 0);
  hsize_t n = sizes.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t a = H5Acreate2(f, "mesh", H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, sizes.data());
  H5Aclose(a);
  H5Sclose(space);
  hid_t scalar = H5Screate(H5S_SCALAR);
  a = H5Acreate2(f, "world_size", H5T_NATIVE_INT64, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &world_size);
  H5Aclose(a);
  hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, names.size());
  a = H5Acreate2(f, "mesh_axes", str, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, str, names.c_str());
  H5Aclose(a);
  H5Tclose(str);
  H5Sclose(scalar);
  H5Fclose(f);
}

TEST_F(Faults, AnAxisThisProgramDoesNotRegisterIsNamed) {
  rewrite_mesh(dir_ + "/index.h5", {1, 1, 1, 1, 2}, "pp,dp,sp,tp,zz", 2);
  std::string e = load_error();
  EXPECT_TRUE(has(e, "axis \"zz\" (size 2)") && has(e, "does not register")) << e;
  // Sizes and names that disagree, or without the core's axes first.
  rewrite_mesh(dir_ + "/index.h5", {1, 1, 1, 1, 2}, "pp,dp,sp,tp", 2);
  e = load_error();
  EXPECT_TRUE(has(e, "does not match its axes")) << e;
  rewrite_mesh(dir_ + "/index.h5", {1, 1, 1, 1}, "dp,pp,sp,tp", 1);
  e = load_error();
  EXPECT_TRUE(has(e, "does not match its axes")) << e;
  // The core's four alone, as every writer so far: loads.
  rewrite_mesh(dir_ + "/index.h5", {1, 1, 1, 1}, "pp,dp,sp,tp", 1);
  EXPECT_EQ(load_error(), "");
}

TEST_F(Faults, ADeadSaveLeavesThePreviousCheckpointAndLatest) {
  // What a save killed mid-way leaves: a temporary directory with some
  // shards and no index. `latest` still names the previous one, which loads.
  std::ofstream(root_ + "/latest") << "step-00000005\n";
  fs::create_directory(root_ + "/.tmp-step-00000010");
  fs::copy_file(shard_, root_ + "/.tmp-step-00000010/shard-0.h5");
  EXPECT_EQ(checkpoint::resolve(root_), dir_);
  EXPECT_TRUE(checkpoint::verify(root_).empty());
  // The next save of that step clears the leftover and commits.
  checkpoint::save_pieces(self(), MeshLayout(MeshShape{}), root_ + "/step-00000010",
                          pieces(weight_, bias_), checkpoint::Metadata{});
  EXPECT_FALSE(fs::exists(root_ + "/.tmp-step-00000010"));
  EXPECT_TRUE(checkpoint::verify(root_ + "/step-00000010").empty());
}

TEST_F(Faults, SafetensorsExportRefusesADamagedCheckpoint) {
  fs::remove(shard_);
  EXPECT_THROW(checkpoint::export_safetensors(dir_, root_ + "/out.safetensors"), Error);
  EXPECT_FALSE(fs::exists(root_ + "/out.safetensors"));
}

}  // namespace
}  // namespace kolos

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  kolos::g_self = kolos::comm::make_mpi_process_group(MPI_COMM_SELF, "self");
  const int rc = RUN_ALL_TESTS();
  kolos::g_self.reset();
  MPI_Finalize();
  return rc;
}
