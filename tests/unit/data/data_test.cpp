// Unit tests of modules/data: synthetic and token file sources, the per-epoch
// permutation, `kolos data prepare`, and every DataError message.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hash.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"

namespace kolos::data {
namespace {

namespace fs = std::filesystem;

// The message of the DataError that `fn` throws; a test failure if none.
std::string data_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const DataError& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected kolos::DataError, got: " << error.what();
    return "";
  }
  ADD_FAILURE() << "expected kolos::DataError, nothing was thrown";
  return "";
}

std::vector<int64_t> read_sample(const TokenSource& source, int64_t index) {
  std::vector<int64_t> out(static_cast<size_t>(source.seq_len() + 1), -1);
  source.sample(index, out.data());
  return out;
}

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kolos_data_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    std::ofstream out(path(name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good());
    return path(name);
  }

  // Writes `ids` as little-endian integers of `width` bytes.
  std::string write_tokens(const std::string& name, const std::vector<uint32_t>& ids,
                           int width) const {
    std::string bytes;
    for (uint32_t id : ids) {
      for (int b = 0; b < width; ++b) bytes += static_cast<char>((id >> (8 * b)) & 0xff);
    }
    return write_bytes(name, bytes);
  }

  // Names in the temp dir that look like prepare's temporary files.
  std::vector<std::string> temp_files() const {
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (name.find(".tmp.") != std::string::npos) found.push_back(name);
    }
    return found;
  }

  fs::path dir_;
};

// ---- synthetic -------------------------------------------------------------

TEST(Synthetic, SameSeedAndIndexGiveTheSameSample) {
  const auto a = make_synthetic_source(16, 256, 42);
  const auto b = make_synthetic_source(16, 256, 42);
  for (int64_t index : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{1} << 40}) {
    EXPECT_EQ(read_sample(*a, index), read_sample(*b, index)) << "index " << index;
    EXPECT_EQ(read_sample(*a, index), read_sample(*a, index)) << "index " << index;
  }
}

TEST(Synthetic, DifferentSeedsGiveDifferentSamples) {
  const auto a = make_synthetic_source(16, 256, 1);
  const auto b = make_synthetic_source(16, 256, 2);
  int differing = 0;
  for (int64_t index = 0; index < 64; ++index) {
    differing += read_sample(*a, index) != read_sample(*b, index) ? 1 : 0;
  }
  EXPECT_GT(differing, 48);
}

TEST(Synthetic, SamplesAreArithmeticProgressionsInRange) {
  for (int64_t vocab : {int64_t{7}, int64_t{256}, int64_t{50257}}) {
    const int64_t seq_len = 33;
    const auto source = make_synthetic_source(seq_len, vocab, 1234);
    EXPECT_EQ(source->seq_len(), seq_len);
    std::set<int64_t> strides;
    std::set<int64_t> starts;
    for (int64_t index = 0; index < 2000; ++index) {
      const auto s = read_sample(*source, index);
      ASSERT_EQ(s.size(), static_cast<size_t>(seq_len + 1));
      const int64_t stride = ((s[1] - s[0]) % vocab + vocab) % vocab;
      strides.insert(stride);
      starts.insert(s[0]);
      for (int64_t i = 0; i <= seq_len; ++i) {
        ASSERT_GE(s[i], 0);
        ASSERT_LT(s[i], vocab);
        ASSERT_EQ(s[i], (s[0] + i * stride) % vocab) << "index " << index << " position " << i;
      }
    }
    EXPECT_EQ(strides, (std::set<int64_t>{1, 2, 3, 5})) << "vocab " << vocab;
    // Starts spread over the vocabulary (2000 draws cover all of a small one).
    EXPECT_GE(static_cast<int64_t>(starts.size()), std::min<int64_t>(vocab, 1000));
  }
}

TEST(Synthetic, DescribesItself) {
  EXPECT_EQ(make_synthetic_source(32, 256, 0)->describe(),
            "synthetic: arithmetic sequences, vocab 256");
}

TEST(Synthetic, RejectsBadArguments) {
  EXPECT_NE(data_error([] { make_synthetic_source(0, 256, 0); }).find("seq_len is 0"),
            std::string::npos);
  EXPECT_NE(data_error([] { make_synthetic_source(8, 0, 0); }).find("vocab is 0"),
            std::string::npos);
  const auto source = make_synthetic_source(8, 256, 0);
  std::vector<int64_t> out(9);
  EXPECT_NE(data_error([&] { source->sample(-1, out.data()); }).find("index -1 is negative"),
            std::string::npos);
}

// ---- the per-epoch permutation ---------------------------------------------

TEST(FeistelPermutation, IsABijectionForManySizes) {
  for (uint64_t n : {1u, 2u, 3u, 4u, 5u, 7u, 16u, 17u, 100u, 1000u, 4097u, 65537u}) {
    for (uint64_t key : {0ull, 1ull, 0xdeadbeefull}) {
      const internal::FeistelPermutation perm(n, key);
      std::vector<bool> seen(n, false);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t image = perm(i);
        ASSERT_LT(image, n) << "n " << n << " key " << key;
        ASSERT_FALSE(seen[image]) << "n " << n << " key " << key << ": " << image << " twice";
        seen[image] = true;
      }
    }
  }
}

TEST(FeistelPermutation, DependsOnTheKeyAndShuffles) {
  const uint64_t n = 1000;
  const internal::FeistelPermutation a(n, 1);
  const internal::FeistelPermutation b(n, 2);
  int differ = 0;
  int fixed = 0;
  for (uint64_t i = 0; i < n; ++i) {
    differ += a(i) != b(i) ? 1 : 0;
    fixed += a(i) == i ? 1 : 0;
  }
  EXPECT_GT(differ, 900);
  EXPECT_LT(fixed, 20);  // a random permutation has ~1 fixed point
}

// ---- token files -----------------------------------------------------------

// Distinct ids that use the high byte(s), so byte order mistakes show.
uint32_t id_at(int64_t k, int width) {
  return width == 2 ? static_cast<uint32_t>(0x0102 + 257 * k) % 65536
                    : static_cast<uint32_t>(0x01020304 + 65793 * k);
}

class TokenFileWidths : public DataTest, public ::testing::WithParamInterface<int> {};

TEST_P(TokenFileWidths, ReadsBackTheWrittenIds) {
  const int width = GetParam();
  const std::string dtype = width == 2 ? "uint16" : "uint32";
  const int64_t seq_len = 8;
  const int64_t windows = 10;
  const int64_t n = 1 + windows * seq_len + 5;  // 5 tokens of tail, never read
  std::vector<uint32_t> ids;
  for (int64_t k = 0; k < n; ++k) ids.push_back(id_at(k, width));
  const std::string file = write_tokens("t.bin", ids, width);
  const int64_t vocab = int64_t{1} << 32;
  const auto source = make_token_file_source(file, dtype, seq_len, vocab, 7);
  EXPECT_EQ(source->seq_len(), seq_len);
  EXPECT_EQ(source->describe(),
            "tokens: " + file + " (" + dtype + ", 86 tokens, 10 samples/epoch)");

  for (int64_t index = 0; index < 3 * windows; ++index) {
    const auto s = read_sample(*source, index);
    const auto where = std::find(ids.begin(), ids.end(), static_cast<uint32_t>(s[0]));
    ASSERT_NE(where, ids.end()) << "index " << index << " starts with an id never written";
    const int64_t first = where - ids.begin();
    ASSERT_EQ(first % seq_len, 0) << "a window starts at a multiple of seq_len";
    ASSERT_LT(first / seq_len, windows);
    for (int64_t i = 0; i <= seq_len; ++i) {
      ASSERT_EQ(s[i], static_cast<int64_t>(ids[first + i])) << "index " << index;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TokenFileWidths, ::testing::Values(2, 4),
                         [](const auto& info) { return info.param == 2 ? "uint16" : "uint32"; });

// Window number of each sample in [begin, end), for a file whose token k is k.
std::vector<int64_t> windows_of(const TokenSource& source, int64_t begin, int64_t end) {
  std::vector<int64_t> windows;
  for (int64_t index = begin; index < end; ++index) {
    windows.push_back(read_sample(source, index)[0] / source.seq_len());
  }
  return windows;
}

TEST_F(DataTest, EveryWindowOncePerEpochInADifferentOrder) {
  const int64_t seq_len = 4;
  const int64_t windows = 13;
  std::vector<uint32_t> ids;
  for (uint32_t k = 0; k < 1 + windows * seq_len; ++k) ids.push_back(k);
  const std::string file = write_tokens("t.bin", ids, 2);
  const auto source = make_token_file_source(file, "uint16", seq_len, 1000, 99);

  std::vector<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < 4; ++e) {
    auto order = windows_of(*source, e * windows, (e + 1) * windows);
    auto sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(windows);
    for (int64_t w = 0; w < windows; ++w) all[w] = w;
    EXPECT_EQ(sorted, all) << "epoch " << e << " does not visit every window exactly once";
    epochs.push_back(order);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_NE(epochs[0], epochs[3]);

  // Same seed: same order; another seed: another order.
  const auto again = make_token_file_source(file, "uint16", seq_len, 1000, 99);
  EXPECT_EQ(windows_of(*again, 0, 2 * windows), windows_of(*source, 0, 2 * windows));
  const auto other = make_token_file_source(file, "uint16", seq_len, 1000, 100);
  EXPECT_NE(windows_of(*other, 0, windows), epochs[0]);
}

TEST_F(DataTest, DescribeUsesThousandsSeparators) {
  const std::string file = path("big.bin");
  { std::ofstream create(file, std::ios::binary); }
  fs::resize_file(file, 2 * 1234567);  // zeros: token id 0
  const auto source = make_token_file_source(file, "uint16", 32, 256, 0);
  EXPECT_EQ(source->describe(),
            "tokens: " + file + " (uint16, 1,234,567 tokens, 38,580 samples/epoch)");
  EXPECT_EQ(read_sample(*source, 38580 * 5 + 3), std::vector<int64_t>(33, 0));
}

TEST_F(DataTest, ConcurrentReadsMatchSerialReads) {
  std::vector<uint32_t> ids;
  for (uint32_t k = 0; k < 4001; ++k) ids.push_back((k * 31) % 50000);
  const std::string file = write_tokens("t.bin", ids, 4);
  const auto tokens = make_token_file_source(file, "uint32", 16, 50000, 5);
  const auto synthetic = make_synthetic_source(16, 50000, 5);
  const int64_t count = 2000;  // 8 epochs of the file

  for (const TokenSource* source : {tokens.get(), synthetic.get()}) {
    std::vector<std::vector<int64_t>> serial;
    for (int64_t index = 0; index < count; ++index) serial.push_back(read_sample(*source, index));

    std::vector<std::vector<std::vector<int64_t>>> parallel(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        // Each thread reads everything, in its own order, to overlap epochs.
        for (int64_t k = 0; k < count; ++k) {
          const int64_t index = t % 2 == 0 ? k : count - 1 - k;
          parallel[t].push_back(read_sample(*source, index));
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < 4; ++t) {
      if (t % 2 == 1) std::reverse(parallel[t].begin(), parallel[t].end());
      EXPECT_EQ(parallel[t], serial) << source->describe() << ", thread " << t;
    }
  }
}

// ---- token file errors -----------------------------------------------------

TEST_F(DataTest, MissingFileIsNamed) {
  const std::string file = path("absent.bin");
  const std::string message =
      data_error([&] { make_token_file_source(file, "uint16", 8, 256, 0); });
  EXPECT_NE(message.find(file), std::string::npos) << message;
  EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
}

TEST_F(DataTest, DirectoryIsRejected) {
  const std::string message =
      data_error([&] { make_token_file_source(dir_.string(), "uint16", 8, 256, 0); });
  EXPECT_NE(message.find(dir_.string() + " is a directory"), std::string::npos) << message;
}

TEST_F(DataTest, PartialTokenIsRejected) {
  const std::string file = write_bytes("odd.bin", std::string(1001, '\0'));
  EXPECT_NE(data_error([&] {
              make_token_file_source(file, "uint16", 8, 256, 0);
            }).find("file " + file + " has 1001 bytes, not a whole number of uint16 tokens"),
            std::string::npos);
  const std::string file32 = write_bytes("odd32.bin", std::string(1002, '\0'));
  EXPECT_NE(data_error([&] {
              make_token_file_source(file32, "uint32", 8, 256, 0);
            }).find("file " + file32 + " has 1002 bytes, not a whole number of uint32 tokens"),
            std::string::npos);
}

TEST_F(DataTest, TooShortFileIsRejected) {
  const std::string file = write_tokens("short.bin", std::vector<uint32_t>(10, 1), 2);
  const std::string message =
      data_error([&] { make_token_file_source(file, "uint16", 32, 256, 0); });
  EXPECT_NE(message.find("file " + file +
                         " needs at least 33 tokens for one sample of seq_len 32, has 10"),
            std::string::npos)
      << message;
  const std::string empty = write_bytes("empty.bin", "");
  EXPECT_NE(data_error([&] { make_token_file_source(empty, "uint16", 32, 256, 0); }).find("has 0"),
            std::string::npos);
}

TEST_F(DataTest, TokenOutsideVocabIsNamedWhenRead) {
  std::vector<uint32_t> ids(20, 5);
  ids[13] = 300;
  const std::string file = write_tokens("vocab.bin", ids, 2);
  const auto source = make_token_file_source(file, "uint16", 19, 256, 0);  // one window
  std::vector<int64_t> out(20);
  const std::string message = data_error([&] { source->sample(0, out.data()); });
  EXPECT_NE(message.find(file), std::string::npos) << message;
  EXPECT_NE(message.find("token 300 at offset 13"), std::string::npos) << message;
  EXPECT_NE(message.find("vocab 256"), std::string::npos) << message;
  // A vocabulary that holds it reads fine.
  EXPECT_EQ(read_sample(*make_token_file_source(file, "uint16", 19, 301, 0), 0)[13], 300);
}

TEST_F(DataTest, UnknownDtypeIsRejected) {
  const std::string file = write_tokens("t.bin", std::vector<uint32_t>(100, 1), 2);
  const std::string message = data_error([&] { make_token_file_source(file, "int8", 8, 256, 0); });
  EXPECT_NE(message.find("unknown dtype 'int8'"), std::string::npos) << message;
  EXPECT_NE(message.find("uint16, uint32"), std::string::npos) << message;
}

// ---- prepare ---------------------------------------------------------------

TEST_F(DataTest, PrepareRoundTripsBytes) {
  std::string binary;
  for (int b = 0; b < 256; ++b) binary += static_cast<char>(b);
  const std::string first = write_bytes("a.txt", "hello, kolos\n");
  const std::string second = write_bytes("b.bin", binary);
  const std::string output = path("out.bin");

  EXPECT_EQ(prepare_byte_tokens({first, second}, output), 13 + 256);
  EXPECT_TRUE(temp_files().empty());

  std::ifstream in(output, std::ios::binary);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string expected_bytes = "hello, kolos\n" + binary;
  ASSERT_EQ(written.size(), 2 * expected_bytes.size());
  for (size_t i = 0; i < expected_bytes.size(); ++i) {
    ASSERT_EQ(static_cast<unsigned char>(written[2 * i]),
              static_cast<unsigned char>(expected_bytes[i]));
    ASSERT_EQ(written[2 * i + 1], '\0');
  }

  // And it reads as a token file of vocab 256.
  const auto source = make_token_file_source(output, "uint16", 12, 256, 0);
  EXPECT_EQ(source->describe(), "tokens: " + output + " (uint16, 269 tokens, 22 samples/epoch)");

  // Preparing again replaces the file.
  EXPECT_EQ(prepare_byte_tokens({first}, output), 13);
  EXPECT_EQ(fs::file_size(output), 26u);
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(DataTest, PrepareNamesAnUnreadableInputAndLeavesNothing) {
  const std::string good = write_bytes("a.txt", "abc");
  const std::string missing = path("missing.txt");
  const std::string output = path("out.bin");

  std::string message = data_error([&] { prepare_byte_tokens({good, missing}, output); });
  EXPECT_NE(message.find("cannot read input " + missing), std::string::npos) << message;
  EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(output));
  EXPECT_TRUE(temp_files().empty());

  const std::string directory = path("subdir");
  fs::create_directory(directory);
  message = data_error([&] { prepare_byte_tokens({good, directory}, output); });
  EXPECT_NE(message.find("cannot read input " + directory), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(output));
  EXPECT_TRUE(temp_files().empty());

  // A failed prepare leaves an existing output as it was.
  write_bytes("out.bin", "old");
  data_error([&] { prepare_byte_tokens({missing}, output); });
  EXPECT_EQ(fs::file_size(output), 3u);
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(DataTest, PrepareNeedsInputs) {
  EXPECT_NE(data_error([&] { prepare_byte_tokens({}, path("out.bin")); }).find("no input files"),
            std::string::npos);
  const std::string empty = write_bytes("empty.txt", "");
  EXPECT_NE(data_error([&] {
              prepare_byte_tokens({empty}, path("out.bin"));
            }).find("inputs hold no bytes"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path("out.bin")));
  EXPECT_TRUE(temp_files().empty());
}

// ---- make_source -----------------------------------------------------------

TEST_F(DataTest, MakeSourceChoosesByKind) {
  RunConfig config;
  config.source = "run.toml";
  config.model.seq_len = 4;
  config.model.vocab = 64;
  config.train.seed = 3;
  EXPECT_EQ(make_source(config)->describe(), "synthetic: arithmetic sequences, vocab 64");
  EXPECT_EQ(read_sample(*make_source(config), 9), read_sample(*make_synthetic_source(4, 64, 3), 9));

  config.data.kind = "tokens";
  EXPECT_NE(data_error([&] {
              make_source(config);
            }).find("run.toml: data.kind = \"tokens\" needs data.path"),
            std::string::npos);
  std::vector<uint32_t> ids;
  for (uint32_t k = 0; k < 41; ++k) ids.push_back(k);
  config.data.path = write_tokens("t.bin", ids, 4);
  config.data.dtype = "uint32";
  const auto source = make_source(config);
  EXPECT_EQ(source->describe(),
            "tokens: " + config.data.path + " (uint32, 41 tokens, 10 samples/epoch)");
  EXPECT_EQ(windows_of(*source, 0, 10),
            windows_of(*make_token_file_source(config.data.path, "uint32", 4, 64, 3), 0, 10));

  config.data.kind = "parquet";
  EXPECT_NE(data_error([&] { make_source(config); }).find("unknown data.kind \"parquet\""),
            std::string::npos);
}

}  // namespace
}  // namespace kolos::data
