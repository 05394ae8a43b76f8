// Hugging Face tokenizer.json with a BPE model (tokenizer.h).
//
// The encoding pipeline, as the Rust `tokenizers` package runs it for one
// sequence:
//   1. added tokens: the text is split on the added tokens that are not
//      "normalized" (leftmost-longest matches; lstrip / rstrip / single_word
//      honoured; added_tokens.cpp); the normalizer (normalizer.cpp) runs on
//      the pieces between, which are then split on the "normalized" ones; a
//      matched added token is one id and is not pre-tokenized;
//   2. the pre-tokenizer (pre_tokenizer.cpp) splits each remaining piece
//      further (Split with a regex, ByteLevel's GPT-2 regex, Digits, a
//      Sequence of them); ByteLevel also maps every byte of a piece to its
//      printable character;
//   3. the BPE model turns each piece into ids (bpe.cpp);
//   4. the post-processor (TemplateProcessing; post_processor.cpp) adds its
//      special tokens.
// Decoding maps ids to token strings (added tokens by content), drops special
// tokens when asked, and runs the decoder chain (decoder.cpp).
//
// Loading checks every key: an unknown key or an unsupported type or value
// is refused with its JSON path ("tokenizer.json: normalizer.type = ...").
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <unordered_map>

#include "added_tokens.h"
#include "bpe.h"
#include "decoder.h"
#include "json_reader.h"
#include "kolos/core/error.h"
#include "kolos/tokenizer/tokenizer.h"
#include "normalizer.h"
#include "post_processor.h"
#include "pre_tokenizer.h"

namespace kolos::tokenizer {
namespace hf {
namespace {

std::string read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw DataError("tokenizer " + path + " is a directory; expected a tokenizer.json file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open tokenizer " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw DataError("cannot read tokenizer " + path);
  return text.str();
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

class HfTokenizer : public Tokenizer {
 public:
  explicit HfTokenizer(const std::string& path) : path_(path) {
    Json j;
    try {
      j = Json::parse(read_file(path));
    } catch (const Json::parse_error& e) {
      throw DataError("tokenizer " + path + " is not valid JSON: " + e.what());
    }
    const Where top(path, "");
    check_keys(j, top,
               {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                "model", "post_processor", "decoder"});
    for (const char* key : {"truncation", "padding"}) {
      if (j.contains(key) && !j[key].is_null()) {
        top.key(key).fail("= " + short_dump(j[key]) +
                          " is not supported; supported: null (kolos encodes whole texts)");
      }
    }
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      normalizer_ = parse_normalizer(j["normalizer"], top.key("normalizer"));
    }
    parse_model(j, top);
    parse_added_tokens(j, top);
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
      pre_tokenizer_ = parse_pre_tokenizer(j["pre_tokenizer"], top.key("pre_tokenizer"));
    }
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      parse_post_processor(j["post_processor"], top.key("post_processor"), &template_);
    }
    for (const TokenId id : template_.before) check_id(id, top.key("post_processor"));
    for (const TokenId id : template_.after) check_id(id, top.key("post_processor"));
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      decoder_ = parse_decoder(j["decoder"], top.key("decoder"));
    }
    find_special_ids();
  }

  std::vector<TokenId> encode(std::string_view raw, bool add_special_tokens) const override {
    const std::string text = to_valid_utf8(raw);
    std::vector<Segment> first, segments;
    split_on_added(text, raw_matcher_, &first);
    for (Segment& s : first) {
      if (s.id) {
        segments.push_back(std::move(s));
      } else {
        split_on_added(normalizer_ ? normalizer_->apply(s.text) : s.text, normalized_matcher_,
                       &segments);
      }
    }
    std::vector<TokenId> ids;
    if (add_special_tokens) ids = template_.before;
    std::unordered_map<std::string, std::vector<TokenId>> cache;
    Pieces pieces;
    for (Segment& s : segments) {
      if (s.id) {
        ids.push_back(*s.id);
        continue;
      }
      pieces.clear();
      pieces.push_back(std::move(s.text));
      if (pre_tokenizer_) pre_tokenizer_->apply(&pieces);
      for (const std::string& piece : pieces) {
        auto it = cache.find(piece);
        if (it == cache.end()) {
          std::vector<TokenId> word;
          model_->tokenize(piece, &word);
          it = cache.emplace(piece, std::move(word)).first;
        }
        ids.insert(ids.end(), it->second.begin(), it->second.end());
      }
    }
    if (add_special_tokens) ids.insert(ids.end(), template_.after.begin(), template_.after.end());
    return ids;
  }

  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const override {
    Pieces tokens;
    tokens.reserve(ids.size());
    for (const TokenId id : ids) {
      if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
        if (skip_special_tokens && it->second->special) continue;
        tokens.push_back(it->second->content);
        continue;
      }
      const std::string* token = model_->id_to_token(id);
      if (token == nullptr) {
        throw Error("tokenizer " + path_ + ": cannot decode id " + std::to_string(id) +
                    ": not in the vocabulary (ids 0.." + std::to_string(vocab_size() - 1) + ")");
      }
      if (skip_special_tokens && special_contents_.count(*token) != 0) continue;
      tokens.push_back(*token);
    }
    if (!decoder_) {
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return to_valid_utf8(out);
    }
    decoder_->decode_chain(&tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return to_valid_utf8(out);
  }

  int64_t vocab_size() const override {
    int64_t bound = model_->id_bound();
    for (const AddedToken& t : added_) bound = std::max<int64_t>(bound, t.id + 1);
    return bound;
  }

  std::optional<TokenId> token_to_id(std::string_view token) const override {
    for (const AddedToken& t : added_) {
      if (t.content == token) return t.id;
    }
    return model_->token_to_id(token);
  }

  std::optional<std::string> id_to_token(TokenId id) const override {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return it->second->content;
    if (const std::string* token = model_->id_to_token(id)) return *token;
    return std::nullopt;
  }

  std::optional<TokenId> bos_id() const override { return bos_; }
  std::optional<TokenId> eos_id() const override { return eos_; }
  std::string description() const override { return "tokenizer.json (BPE)"; }
  const std::string& path() const override { return path_; }

 private:
  void check_id(TokenId id, const Where& where) const {
    if (id < 0 || (!model_->id_to_token(id) && added_by_id_.count(id) == 0)) {
      where.fail("names id " + std::to_string(id) + ", which is not in the vocabulary");
    }
  }

  void parse_model(const Json& j, const Where& top) {
    const Where where = top.key("model");
    const auto it = j.find("model");
    if (it == j.end() || it->is_null()) where.fail("is missing");
    const Json& m = *it;
    const std::string type = get_type(m, where);
    if (type != "BPE") unsupported_type(where, type, {"BPE"});
    check_keys(m, where,
               {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
    if (m.contains("dropout") && !m["dropout"].is_null()) {
      if (!m["dropout"].is_number()) where.key("dropout").fail("must be a number or null");
      if (m["dropout"].get<double>() != 0.0) {
        where.key("dropout").fail("= " + short_dump(m["dropout"]) +
                                  " is not supported; supported: null or 0 (deterministic "
                                  "encoding)");
      }
    }
    BpeOptions options;
    options.unk_token = get_string(m, "unk_token", where);
    options.continuing_subword_prefix =
        get_string(m, "continuing_subword_prefix", where).value_or("");
    options.end_of_word_suffix = get_string(m, "end_of_word_suffix", where).value_or("");
    options.fuse_unk = get_bool(m, "fuse_unk", where, false);
    options.byte_fallback = get_bool(m, "byte_fallback", where, false);
    options.ignore_merges = get_bool(m, "ignore_merges", where, false);

    const auto vocab = m.find("vocab");
    if (vocab == m.end() || !vocab->is_object())
      where.key("vocab").fail("must be an object of token: id");
    std::vector<std::pair<std::string, TokenId>> entries;
    entries.reserve(vocab->size());
    for (const auto& item : vocab->items()) {
      if (!item.value().is_number_integer() || item.value().get<int64_t>() < 0 ||
          item.value().get<int64_t>() > INT32_MAX) {
        where.key("vocab").fail("[\"" + item.key() + "\"] = " + short_dump(item.value()) +
                                " is not an id (an integer 0..2^31-1)");
      }
      entries.emplace_back(item.key(), static_cast<TokenId>(item.value().get<int64_t>()));
    }
    const auto merges = m.find("merges");
    const Where mw = where.key("merges");
    std::vector<std::pair<std::string, std::string>> pairs;
    if (merges != m.end() && !merges->is_null()) {
      if (!merges->is_array()) mw.fail("must be a list");
      pairs.reserve(merges->size());
      for (size_t i = 0; i < merges->size(); ++i) {
        const Json& e = (*merges)[i];
        if (e.is_string()) {
          // The older spelling "a b": one space separates the two tokens.
          const std::string s = e.get<std::string>();
          const size_t space = s.find(' ');
          if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
            mw.index(i).fail("= " + short_dump(e) + " must be two tokens separated by one space");
          }
          pairs.emplace_back(s.substr(0, space), s.substr(space + 1));
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
          pairs.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
        } else {
          mw.index(i).fail("= " + short_dump(e) + " must be [\"a\", \"b\"] or \"a b\"");
        }
      }
    }
    model_ = std::make_unique<BpeModel>(std::move(entries), pairs, std::move(options),
                                        path_ + ": model");
  }

  void parse_added_tokens(const Json& j, const Where& top) {
    const auto it = j.find("added_tokens");
    if (it == j.end() || it->is_null()) return;
    const Where where = top.key("added_tokens");
    if (!it->is_array()) where.fail("must be a list");
    added_.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& e = (*it)[i];
      const Where at = where.index(i);
      check_keys(e, at,
                 {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
      AddedToken token;
      if (!e.contains("id") || !e["id"].is_number_integer() || e["id"].get<int64_t>() < 0 ||
          e["id"].get<int64_t>() > INT32_MAX) {
        at.key("id").fail("must be an id (an integer 0..2^31-1)");
      }
      token.id = static_cast<TokenId>(e["id"].get<int64_t>());
      const auto content = get_string(e, "content", at);
      if (!content || content->empty()) at.key("content").fail("must be a non-empty string");
      token.content = *content;
      token.single_word = get_bool(e, "single_word", at, false);
      token.lstrip = get_bool(e, "lstrip", at, false);
      token.rstrip = get_bool(e, "rstrip", at, false);
      token.normalized = get_bool(e, "normalized", at, true);
      token.special = get_bool(e, "special", at, false);
      // A normalized token is matched in its normalized form.
      token.pattern =
          token.normalized && normalizer_ ? normalizer_->apply(token.content) : token.content;
      added_.push_back(std::move(token));
    }
    for (const AddedToken& token : added_) {
      added_by_id_[token.id] = &token;
      (token.normalized ? normalized_matcher_ : raw_matcher_).add(&token);
      if (token.special) special_contents_.insert(token.content);
    }
  }

  // bos and eos: tokenizer_config.json next to the file, else well-known
  // token names (docs/tokenizers.md).
  void find_special_ids() {
    const std::string config_path = parent_directory(path_) + "/tokenizer_config.json";
    std::ifstream in(config_path);
    if (in) {
      Json config;
      try {
        config = Json::parse(in);
      } catch (const Json::parse_error& e) {
        throw DataError("tokenizer config " + config_path + " is not valid JSON: " + e.what());
      }
      auto named = [&](const char* key) -> std::optional<TokenId> {
        const auto it = config.find(key);
        if (it == config.end() || it->is_null()) return std::nullopt;
        std::string content;
        if (it->is_string()) {
          content = it->get<std::string>();
        } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
          content = (*it)["content"].get<std::string>();
        } else {
          throw DataError(config_path + ": " + key +
                          " must be a token string or {\"content\": ...}");
        }
        const auto id = token_to_id(content);
        if (!id) {
          throw DataError(config_path + ": " + key + " = \"" + content + "\" is not a token of " +
                          path_);
        }
        return id;
      };
      bos_ = named("bos_token");
      eos_ = named("eos_token");
    }
    // Only special added tokens qualify: a BPE vocabulary may hold
    // "<|endoftext|>" as ordinary text it learned.
    auto first_of = [&](std::initializer_list<const char*> names) -> std::optional<TokenId> {
      for (const char* name : names) {
        for (const AddedToken& t : added_) {
          if (t.special && t.content == name) return t.id;
        }
      }
      return std::nullopt;
    };
    if (!bos_) bos_ = first_of({"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"});
    if (!eos_) eos_ = first_of({"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"});
  }

  std::string path_;
  std::unique_ptr<BpeModel> model_;
  std::vector<AddedToken> added_;  // never resized after parse_added_tokens
  std::unordered_map<TokenId, const AddedToken*> added_by_id_;
  std::set<std::string> special_contents_;
  AddedMatcher raw_matcher_;                // normalized = false
  AddedMatcher normalized_matcher_;         // normalized = true
  std::unique_ptr<Normalizer> normalizer_;  // nullptr: the identity
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  Template template_;
  std::optional<TokenId> bos_, eos_;
};

}  // namespace
}  // namespace hf

std::unique_ptr<Tokenizer> open_hf_tokenizer_json(const std::string& path) {
  return std::make_unique<hf::HfTokenizer>(path);
}

}  // namespace kolos::tokenizer
