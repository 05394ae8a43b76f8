// SentencePiece models (tokenizer.model) through libsentencepiece.
//
// The model carries its own normalizer (e.g. nmt_nfkc), pieces and
// algorithm (BPE or unigram); the library applies them all. encode() gives
// the ids of `SentencePieceProcessor.encode(text)` in Python: no bos or eos
// unless the caller adds them (the model's bos_id() / eos_id() say which).
#include <sentencepiece_processor.h>

#include "kolos/core/error.h"
#include "kolos/tokenizer/tokenizer.h"

namespace kolos::tokenizer {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const auto status = processor_.Load(path);
    if (!status.ok()) {
      throw DataError("cannot read tokenizer " + path + " as a SentencePiece model: " +
                      status.ToString() + " (a Hugging Face tokenizer.json must be named *.json)");
    }
  }

  std::vector<TokenId> encode(std::string_view text, bool) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(to_valid_utf8(text), &ids);
    if (!status.ok()) {
      throw Error("tokenizer " + path_ + ": SentencePiece cannot encode: " + status.ToString());
    }
    return std::vector<TokenId>(ids.begin(), ids.end());
  }

  std::string decode(const std::vector<TokenId>& ids, bool) const override {
    const int size = processor_.GetPieceSize();
    for (const TokenId id : ids) {
      if (id < 0 || id >= size) {
        throw Error("tokenizer " + path_ + ": cannot decode id " + std::to_string(id) +
                    ": not in the vocabulary (ids 0.." + std::to_string(size - 1) + ")");
      }
    }
    std::string text;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok()) {
      throw Error("tokenizer " + path_ + ": SentencePiece cannot decode: " + status.ToString());
    }
    return to_valid_utf8(text);
  }

  int64_t vocab_size() const override { return processor_.GetPieceSize(); }

  std::optional<TokenId> token_to_id(std::string_view token) const override {
    // PieceToId answers the unknown id for any piece it does not know.
    const int id = processor_.PieceToId(token);
    if (id < 0 || (processor_.IsUnknown(id) && processor_.IdToPiece(id) != token)) {
      return std::nullopt;
    }
    return id;
  }

  std::optional<std::string> id_to_token(TokenId id) const override {
    if (id < 0 || id >= processor_.GetPieceSize()) return std::nullopt;
    return processor_.IdToPiece(id);
  }

  std::optional<TokenId> bos_id() const override { return known(processor_.bos_id()); }
  std::optional<TokenId> eos_id() const override { return known(processor_.eos_id()); }
  std::string description() const override { return "sentencepiece"; }
  const std::string& path() const override { return path_; }

 private:
  // SentencePiece says -1 for a special piece the model was trained without.
  std::optional<TokenId> known(int id) const {
    if (id < 0 || id >= processor_.GetPieceSize()) return std::nullopt;
    return id;
  }

  std::string path_;
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::unique_ptr<Tokenizer> open_sentencepiece_model(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace kolos::tokenizer
