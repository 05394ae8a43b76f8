// libkolos_tokenizer (torch-free): round trips, special tokens, refusal of
// unsupported tokenizer.json features, bad input, the token file writer.
// The tokenizers are written by the tests themselves: a small byte-level BPE
// tokenizer.json, and a SentencePiece model trained here with
// libsentencepiece's trainer. Identity with the Python packages on a large
// corpus is tests/e2e/tokenizer (label interop).
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "kolos/core/error.h"
#include "kolos/tokenizer/token_file.h"
#include "kolos/tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using kolos::tokenizer::open_tokenizer;
using kolos::tokenizer::TokenId;
using kolos::tokenizer::Tokenizer;
using Json = nlohmann::json;

namespace {

// GPT-2's printable form of byte b (bytes_to_unicode), as UTF-8.
std::string byte_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
      const int cp = printable ? i : next++;
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      t[static_cast<size_t>(i)] = s;
    }
    return t;
  }();
  return table[static_cast<size_t>(b)];
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kolos_tokenizer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }

  // A GPT-2-style byte-level BPE: the 256 byte tokens (ids 0..255, in byte
  // order), merges making "hello" and "Ġworld", and <|endoftext|> = 300.
  static Json byte_level_bpe() {
    Json vocab = Json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"h", "e"}, {"l", "l"},   {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"},
        {"o", "r"}, {"Ġw", "or"}, {"l", "d"},   {"Ġwor", "ld"}};
    Json merge_list = Json::array();
    int next = 256;
    for (const auto& [a, b] : merges) {
      vocab[a + b] = next++;
      merge_list.push_back({a, b});
    }
    Json j;
    j["version"] = "1.0";
    j["truncation"] = nullptr;
    j["padding"] = nullptr;
    j["added_tokens"] = Json::array({Json{{"id", 300},
                                          {"content", "<|endoftext|>"},
                                          {"single_word", false},
                                          {"lstrip", false},
                                          {"rstrip", false},
                                          {"normalized", false},
                                          {"special", true}}});
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "ByteLevel"},
                          {"add_prefix_space", false},
                          {"trim_offsets", true},
                          {"use_regex", true}};
    j["post_processor"] = {{"type", "ByteLevel"},
                           {"add_prefix_space", true},
                           {"trim_offsets", false},
                           {"use_regex", true}};
    j["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", merge_list}};
    return j;
  }

  std::string write_json(const Json& j, const std::string& name = "tokenizer.json") {
    return write(name, j.dump());
  }

  // The error open_tokenizer() throws for `j`.
  std::string load_error(const Json& j) {
    const std::string path = write_json(j);
    try {
      open_tokenizer(path);
    } catch (const kolos::DataError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error for " << j.dump().substr(0, 200);
    return "";
  }

  fs::path dir_;
};

TEST(Utf8, ReplacesLikePython) {
  using kolos::tokenizer::to_valid_utf8;
  const std::string r = "\xEF\xBF\xBD";
  // Expected: Python's bytes.decode("utf-8", errors="replace").encode().
  EXPECT_EQ(to_valid_utf8("abc"), "abc");
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(to_valid_utf8("\xFF"), r);
  EXPECT_EQ(to_valid_utf8("\xC0\xAF"), r + r);
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(to_valid_utf8("\xE2\x82"), r);
  EXPECT_EQ(to_valid_utf8("\xE2\x82x"), r + "x");
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98"), r);
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(to_valid_utf8("\xE0\x80\x80"), r + r + r);
  EXPECT_EQ(to_valid_utf8("\xC2"), r);
  EXPECT_EQ(to_valid_utf8("a\x80\x80"
                          "b"),
            "a" + r + r + "b");
  EXPECT_EQ(to_valid_utf8("\xF5\x80"), r + r);
}

TEST_F(TokenizerTest, ByteLevelMergesAndRoundTrip) {
  const auto tok = open_tokenizer(write_json(byte_level_bpe()));
  EXPECT_EQ(tok->description(), "tokenizer.json (BPE)");
  EXPECT_EQ(tok->vocab_size(), 301);
  const TokenId hello = *tok->token_to_id("hello");
  const TokenId world = *tok->token_to_id("Ġworld");
  EXPECT_EQ(tok->encode("hello world"), (std::vector<TokenId>{hello, world}));
  EXPECT_EQ(*tok->id_to_token(world), "Ġworld");
  EXPECT_FALSE(tok->token_to_id("nope").has_value());
  EXPECT_FALSE(tok->id_to_token(5000).has_value());
  for (const std::string text :
       {"hello world", "  leading and trailing  ", "tabs\tand\nnewlines\r\n", "日本語のテキスト",
        "emoji 😀👩‍💻🇫🇷", "code: for (int i = 0; i < n; ++i) { x += y; }", "", " ",
        "numbers 1234567890 3.14"}) {
    EXPECT_EQ(tok->decode(tok->encode(text)), text) << text;
  }
}

TEST_F(TokenizerTest, InvalidUtf8IsReplacedNotFatal) {
  const auto tok = open_tokenizer(write_json(byte_level_bpe()));
  const std::string bad = "ok \xFF\xC0 \xE2\x82 end";
  const auto ids = tok->encode(bad);
  // Same ids as the replaced text (what the Python package is given).
  EXPECT_EQ(ids, tok->encode(kolos::tokenizer::to_valid_utf8(bad)));
  EXPECT_EQ(tok->decode(ids), "ok \xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD end");
  // A multi-byte character cut between tokens decodes to U+FFFD, not to bytes.
  const auto cjk = tok->encode("語");
  ASSERT_EQ(cjk.size(), 3u);
  EXPECT_EQ(tok->decode({cjk[0], cjk[1]}), "\xEF\xBF\xBD");
}

TEST_F(TokenizerTest, ConcurrentEncodeGivesTheSameIds) {
  const auto tok = open_tokenizer(write_json(byte_level_bpe()));
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back("hello world " + std::to_string(i * 7919) + " 日本語 😀<|endoftext|>\xFF");
  }
  std::vector<std::vector<TokenId>> expected;
  for (const auto& t : texts) expected.push_back(tok->encode(t));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (tok->encode(texts[i]) != expected[i]) ++mismatches[static_cast<size_t>(k)];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST_F(TokenizerTest, SpecialTokensMatchedBeforePreTokenization) {
  const auto tok = open_tokenizer(write_json(byte_level_bpe()));
  EXPECT_EQ(*tok->eos_id(), 300);
  EXPECT_FALSE(tok->bos_id().has_value());
  const auto ids = tok->encode("hello<|endoftext|>hello");
  const TokenId hello = *tok->token_to_id("hello");
  EXPECT_EQ(ids, (std::vector<TokenId>{hello, 300, hello}));
  EXPECT_EQ(tok->decode(ids), "hellohello");
  EXPECT_EQ(tok->decode(ids, /*skip_special_tokens=*/false), "hello<|endoftext|>hello");
  // A prefix of a special token is ordinary text.
  EXPECT_EQ(tok->decode(tok->encode("<|endof")), "<|endof");
}

TEST_F(TokenizerTest, TemplateProcessingAndConfigNames) {
  Json j = byte_level_bpe();
  j["added_tokens"].push_back(
      {{"id", 301}, {"content", "<|begin_of_text|>"}, {"special", true}, {"normalized", false}});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", Json::array({Json{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                              Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", Json::array()},
      {"special_tokens",
       {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {301}}, {"tokens", {"x"}}}}}}};
  const std::string path = write_json(j, "llama/tokenizer.json");
  auto tok = open_tokenizer(dir_ / "llama");
  const TokenId hello = *tok->token_to_id("hello");
  EXPECT_EQ(tok->encode("hello"), (std::vector<TokenId>{301, hello}));
  EXPECT_EQ(tok->encode("hello", /*add_special_tokens=*/false), (std::vector<TokenId>{hello}));
  EXPECT_EQ(*tok->bos_id(), 301);
  EXPECT_EQ(*tok->eos_id(), 300);
  // tokenizer_config.json names them.
  write("llama/tokenizer_config.json",
        R"({"bos_token": {"content": "hello"}, "eos_token": "<|begin_of_text|>"})");
  tok = open_tokenizer(path);
  EXPECT_EQ(*tok->bos_id(), hello);
  EXPECT_EQ(*tok->eos_id(), 301);
  write("llama/tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  try {
    open_tokenizer(path);
    FAIL() << "an eos_token that is not a token was accepted";
  } catch (const kolos::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("eos_token = \"<|nope|>\" is not a token"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TokenizerTest, SplitRegexAndAddedTokenOptions) {
  Json j = byte_level_bpe();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array({Json{{"type", "Split"},
                         {"pattern", {{"Regex", R"(\p{N}{1,3}| ?\p{L}+|\s+(?!\S)|\s+|.)"}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                    Json{{"type", "ByteLevel"},
                         {"add_prefix_space", false},
                         {"trim_offsets", true},
                         {"use_regex", false}}})}};
  j["added_tokens"].push_back({{"id", 302},
                               {"content", "wor"},
                               {"single_word", true},
                               {"lstrip", true},
                               {"rstrip", false},
                               {"normalized", true},
                               {"special", false}});
  const auto tok = open_tokenizer(write_json(j));
  // "wor" alone is matched with the space before it (lstrip); inside
  // "world" it is not a single word.
  const auto ids = tok->encode("hello  wor world 12345");
  EXPECT_NE(std::find(ids.begin(), ids.end(), 302), ids.end());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 302), 1);
  // An added token decodes to its content: the stripped spaces are gone.
  EXPECT_EQ(tok->decode(ids), "hellowor world 12345");
  EXPECT_EQ(tok->decode(tok->encode("world")), "world");
}

TEST_F(TokenizerTest, UnicodeNormalizers) {
  Json j = byte_level_bpe();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", Json::array({Json{{"type", "NFC"}}})}};
  // "é" as e + U+0301 is composed to U+00E9 before pre-tokenization.
  const auto nfc = open_tokenizer(write_json(j, "nfc.json"));
  EXPECT_EQ(nfc->encode("cafe\xCC\x81"), nfc->encode("caf\xC3\xA9"));
  EXPECT_EQ(nfc->decode(nfc->encode("cafe\xCC\x81")), "caf\xC3\xA9");
  j["normalizer"] = {{"type", "NFKC"}};
  const auto nfkc = open_tokenizer(write_json(j, "nfkc.json"));
  EXPECT_EQ(nfkc->decode(nfkc->encode("\xEF\xAC\x81")), "fi");  // U+FB01, the fi ligature
  // A special token is matched on the raw text, before normalization.
  EXPECT_EQ(nfkc->encode("<|endoftext|>"), (std::vector<TokenId>{300}));
  // LLaMA-2's: "▁" in front of each piece and for every space.
  const std::string bar = "\xE2\x96\x81";  // U+2581
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       Json::array({Json{{"type", "Prepend"}, {"prepend", bar}},
                    Json{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", bar}}})}};
  const auto meta = open_tokenizer(write_json(j, "meta.json"));
  EXPECT_EQ(meta->decode(meta->encode("a b<|endoftext|>c")), bar + "a" + bar + "b" + bar + "c");
  j["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       Json::array({Json{{"type", "ByteLevel"}},
                    Json{{"type", "Replace"}, {"pattern", {{"String", bar}}}, {"content", " "}},
                    Json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  const auto spaced = open_tokenizer(write_json(j, "spaced.json"));
  EXPECT_EQ(spaced->decode(spaced->encode("a b")), "a b");
}

TEST_F(TokenizerTest, RefusesUnsupportedFeaturesByJsonPath) {
  struct Case {
    std::string what;
    std::function<void(Json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"normalizer",
       [](Json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type = \"Lowercase\" is not supported; supported: NFC, NFD, NFKC, NFKD"},
      {"model", [](Json& j) { j["model"]["type"] = "WordPiece"; },
       "model.type = \"WordPiece\" is not supported; supported: BPE"},
      {"pre_tokenizer",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type = \"Whitespace\" is not supported; supported: ByteLevel, Split"},
      {"nested",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", Json::array({Json{{"type", "Metaspace"}}})}};
       },
       "pre_tokenizer.pretokenizers[0].type = \"Metaspace\" is not supported"},
      {"decoder",
       [](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder.type = \"WordPiece\" is not supported"},
      {"post_processor",
       [](Json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "post_processor.type = \"BertProcessing\" is not supported"},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; },
       "model.dropout = 0.1 is not supported"},
      {"truncation",
       [](Json& j) {
         j["truncation"] = {{"max_length", 8}};
       },
       "truncation = {\"max_length\":8} is not supported"},
      {"unknown key", [](Json& j) { j["model"]["shiny"] = true; },
       "model.shiny is not supported (value true); supported keys here:"},
      {"split behavior",
       [](Json& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
       },
       "pre_tokenizer.behavior = \"Sideways\" is not supported; supported: Removed, Isolated"},
      {"bad regex",
       [](Json& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
       },
       "pre_tokenizer.pattern: cannot compile the regex \"(unclosed\""},
  };
  for (const Case& c : cases) {
    Json j = byte_level_bpe();
    c.edit(j);
    const std::string error = load_error(j);
    EXPECT_NE(error.find(c.message), std::string::npos) << c.what << ": " << error;
  }
}

TEST_F(TokenizerTest, BadInput) {
  // Missing file, a directory with neither file, malformed JSON.
  EXPECT_THROW(open_tokenizer((dir_ / "missing.json").string()), kolos::DataError);
  try {
    open_tokenizer(dir_.string());
    FAIL();
  } catch (const kolos::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("holds neither tokenizer.json nor tokenizer.model"),
              std::string::npos);
  }
  try {
    open_tokenizer(write("broken.json", "{\"model\": {\"type\": \"BPE\", "));
    FAIL();
  } catch (const kolos::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("is not valid JSON"), std::string::npos) << e.what();
  }
  // A merge naming a token that is not in the vocabulary.
  Json j = byte_level_bpe();
  j["model"]["merges"].push_back({"hello", "zzz"});
  std::string error = load_error(j);
  EXPECT_NE(error.find("model.merges[9] = [\"hello\", \"zzz\"] names \"zzz\", which is not in "
                       "the vocabulary"),
            std::string::npos)
      << error;
  // A merge whose result is not in the vocabulary; the old "a b" spelling.
  j = byte_level_bpe();
  j["model"]["merges"].push_back("x y");
  error = load_error(j);
  EXPECT_NE(error.find("model.merges[9] = [\"x\", \"y\"] makes \"xy\""), std::string::npos)
      << error;
  // Not a SentencePiece model either.
  try {
    open_tokenizer(write("tokenizer.model", "not a protobuf"));
    FAIL();
  } catch (const kolos::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("as a SentencePiece model"), std::string::npos);
  }
  // Decoding an id outside the vocabulary.
  const auto tok = open_tokenizer(write_json(byte_level_bpe(), "ok.json"));
  EXPECT_THROW(tok->decode({5000}), kolos::Error);
}

TEST_F(TokenizerTest, SentencePieceRoundTrip) {
  std::string corpus;
  for (int i = 0; i < 300; ++i) {
    corpus += "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog 日本語\n";
  }
  const std::string input = write("corpus.txt", corpus);
  const std::string prefix = (dir_ / "sp").string();
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + input + " --model_prefix=" + prefix +
      " --vocab_size=400 --model_type=bpe --byte_fallback=true --minloglevel=2"
      " --num_threads=1");
  ASSERT_TRUE(status.ok()) << status.ToString();
  const auto tok = open_tokenizer(prefix + ".model");
  EXPECT_EQ(tok->description(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(*tok->bos_id(), 1);
  EXPECT_EQ(*tok->eos_id(), 2);
  EXPECT_EQ(*tok->token_to_id("</s>"), 2);
  EXPECT_FALSE(tok->token_to_id("no such piece").has_value());
  EXPECT_EQ(*tok->id_to_token(2), "</s>");
  for (const std::string text : {"the quick brown fox", "unseen 🚀 characters ü", "日本語"}) {
    EXPECT_EQ(tok->decode(tok->encode(text)), text) << text;
  }
  // Invalid UTF-8 is replaced, as for every format.
  EXPECT_EQ(tok->encode("a\xFF"
                        "b"),
            tok->encode("a\xEF\xBF\xBD"
                        "b"));
  EXPECT_THROW(tok->decode({400}), kolos::Error);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_F(TokenizerTest, PrepareTokenFile) {
  using kolos::tokenizer::prepare_token_file;
  const auto tok = open_tokenizer(write_json(byte_level_bpe()));
  const std::string a = write("a.txt", "hello world"), b = write("b.txt", "hello");
  const std::string out = (dir_ / "out.bin").string();
  const auto r = prepare_token_file({a, b}, out, *tok, 2);
  EXPECT_EQ(r.dtype, "uint16");
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.vocab, 301);
  const TokenId hello = *tok->token_to_id("hello"), world = *tok->token_to_id("Ġworld");
  const std::vector<TokenId> expected = {hello, world, 300, hello};
  EXPECT_EQ(r.tokens, 4);
  std::vector<uint8_t> bytes;
  for (TokenId id : expected) {
    bytes.push_back(static_cast<uint8_t>(id & 0xFF));
    bytes.push_back(static_cast<uint8_t>(id >> 8));
  }
  EXPECT_EQ(read_bytes(out), bytes);

  // A vocabulary past 65536 ids is written as uint32.
  Json j = byte_level_bpe();
  j["added_tokens"].push_back(
      {{"id", 70000}, {"content", "<|big|>"}, {"special", true}, {"normalized", false}});
  const auto big = open_tokenizer(write_json(j, "big.json"));
  const std::string c = write("c.txt", "<|big|>");
  const auto r32 = prepare_token_file({c, b}, out, *big);
  EXPECT_EQ(r32.dtype, "uint32");
  EXPECT_EQ(r32.vocab, 70001);
  const std::vector<uint8_t> expected32 = {
      0x70, 0x11, 0x01, 0x00, 0x2C, 0x01, 0x00, 0x00, static_cast<uint8_t>(hello),
      0x01, 0x00, 0x00};
  EXPECT_EQ(read_bytes(out), expected32);

  // Errors leave an existing output as it was and no temporary file behind.
  EXPECT_THROW(prepare_token_file({a, (dir_ / "missing.txt").string()}, out, *tok),
               kolos::DataError);
  EXPECT_EQ(read_bytes(out), expected32);
  Json no_eos = byte_level_bpe();
  no_eos["added_tokens"] = Json::array();
  const auto plain = open_tokenizer(write_json(no_eos, "plain.json"));
  try {
    prepare_token_file({a, b}, out, *plain);
    FAIL();
  } catch (const kolos::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("names no end-of-text token (eos)"), std::string::npos);
  }
  EXPECT_EQ(prepare_token_file({a}, out, *plain).tokens, 2);  // one document needs no eos
  // A vocabulary entry spelled like an eos, but not a special added token,
  // is not one.
  no_eos["model"]["vocab"]["<|endoftext|>"] = 299;
  EXPECT_FALSE(open_tokenizer(write_json(no_eos, "learned.json"))->eos_id().has_value());
  EXPECT_THROW(prepare_token_file({write("empty.txt", "")}, out, *tok), kolos::DataError);
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos);
  }
}

}  // namespace
