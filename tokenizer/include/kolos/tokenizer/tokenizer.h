// Tokenizers: text <-> token ids, one interface for two file formats.
//
//   - Hugging Face `tokenizer.json` with a BPE model: byte-level BPE as in
//     GPT-2 and the LLaMA-3 / Qwen family (Split regex + ByteLevel), and
//     byte-fallback BPE as in LLaMA-2 converted by Hugging Face: merges
//     applied by rank, added and special tokens matched before
//     pre-tokenization, the Unicode normalizers (NFC, NFD, NFKC, NFKD),
//     Prepend and Replace, byte fallback, unknown-token handling, the
//     ByteLevel / ByteFallback / Fuse / Strip / Replace decoders and the
//     TemplateProcessing post-processor (docs/tokenizers.md lists every
//     supported field). Anything else in the file is refused when it is
//     loaded, with an error naming its JSON path and what would be valid;
//     nothing is silently ignored.
//   - SentencePiece `tokenizer.model`, through libsentencepiece.
//
// Both give the ids the reference Python packages give on the same text:
// `tokenizers.Tokenizer.from_file(path).encode(text).ids` and
// `sentencepiece.SentencePieceProcessor(model_file=path).encode(text)`.
//
// Invalid UTF-8: the Python packages take `str`, so bytes reach them
// decoded. encode() accepts any bytes and first replaces each ill-formed
// sequence by U+FFFD exactly as Python's `bytes.decode("utf-8",
// errors="replace")` does (one U+FFFD per maximal ill-formed subpart, the
// Unicode "best practice"; see to_valid_utf8()), for every format. So
// encode(raw) equals the Python package's encode(raw.decode("utf-8",
// "replace")); it never throws for bad input bytes. decode() always returns
// valid UTF-8: bytes that do not form UTF-8 (a byte-level token cut inside a
// character) become U+FFFD in the same way, as the Python packages do.
//
// Thread safety: a Tokenizer is immutable after it is opened; encode(),
// decode() and the lookups may be called from several threads at once.
//
// Errors: opening throws kolos::Error (kind data) naming the file, and for
// tokenizer.json the JSON path of the field at fault. decode() throws
// kolos::Error for an id outside [0, vocab_size()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kolos::tokenizer {

using TokenId = int32_t;

class Tokenizer {
 public:
  virtual ~Tokenizer();

  // Token ids of `text` (any bytes; see the header comment for invalid
  // UTF-8). add_special_tokens: apply the file's post-processor (e.g.
  // LLaMA-3's TemplateProcessing puts <|begin_of_text|> first), as the
  // Python `tokenizers` package does by default. SentencePiece models have
  // no post-processor: the flag does nothing there, matching
  // `SentencePieceProcessor.encode(text)`.
  virtual std::vector<TokenId> encode(std::string_view text,
                                      bool add_special_tokens = true) const = 0;

  // Text of `ids`, valid UTF-8. skip_special_tokens: leave out special
  // tokens (tokenizers' default); SentencePiece always leaves out control
  // tokens (bos, eos), as its decoder does.
  virtual std::string decode(const std::vector<TokenId>& ids,
                             bool skip_special_tokens = true) const = 0;

  // One more than the largest id the tokenizer can produce (model vocabulary
  // and added tokens): what `model.vocab` must be at least.
  virtual int64_t vocab_size() const = 0;

  // The token's id, or nullopt when it is not in the vocabulary (added tokens
  // included).
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  // The token string of `id` as the file spells it (byte-level tokens in
  // their printable form, e.g. "Ġthe"); nullopt when out of range.
  virtual std::optional<std::string> id_to_token(TokenId id) const = 0;

  // Beginning and end of text, where the file says or a well-known token is
  // present (docs/tokenizers.md, "Special ids"); nullopt when unknown.
  // eos_id() is what `kolos data prepare --tokenizer` puts between documents.
  virtual std::optional<TokenId> bos_id() const = 0;
  virtual std::optional<TokenId> eos_id() const = 0;

  // "tokenizer.json (BPE)" or "sentencepiece (BPE)" and the like, for reports.
  virtual std::string description() const = 0;
  // The file it was read from.
  virtual const std::string& path() const = 0;
};

// Opens `path`: a tokenizer.json file (any *.json), a SentencePiece model
// (any other file, e.g. tokenizer.model), or a directory holding
// tokenizer.json (preferred) or tokenizer.model. Next to a tokenizer.json, a
// tokenizer_config.json's "bos_token" and "eos_token" name the bos and eos
// ids. Throws kolos::DataError naming the path when it is missing, is a
// directory with neither file, or cannot be read as its format.
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path);

// The two readers behind open_tokenizer(), for callers that know the format.
std::unique_ptr<Tokenizer> open_hf_tokenizer_json(const std::string& path);
std::unique_ptr<Tokenizer> open_sentencepiece_model(const std::string& path);

// `bytes` with every ill-formed UTF-8 sequence replaced by U+FFFD (EF BF BD),
// one per maximal subpart of an ill-formed sequence, as Python's
// `bytes.decode("utf-8", errors="replace")` and Rust's
// `String::from_utf8_lossy` do: surrogates (ED A0..BF xx), overlong forms
// (C0, C1, E0 80..9F, F0 80..8F), code points above U+10FFFF and stray
// continuation bytes each become U+FFFD per byte; a truncated but otherwise
// valid prefix of a sequence becomes one U+FFFD. Valid input is returned
// unchanged.
std::string to_valid_utf8(std::string_view bytes);

}  // namespace kolos::tokenizer
