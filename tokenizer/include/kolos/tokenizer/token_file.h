// `kolos data prepare --tokenizer PATH`: text files to a token file that
// `[data] kind = "tokens"` reads (docs/data.md).
//
// Each input file is one document, encoded with Tokenizer::encode(text)
// (post-processor included, as the Python packages do by default); the
// tokenizer's eos id is written between consecutive documents (not after the
// last). Ids are little-endian uint16 when vocab_size() <= 65536, else
// uint32, with no header: the run then sets data.dtype to the reported dtype
// and model.vocab to at least the reported vocab.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/tokenizer/tokenizer.h"

namespace kolos::tokenizer {

struct PreparedTokens {
  int64_t tokens = 0;         // ids written, eos separators included
  int64_t documents = 0;      // input files
  int64_t input_bytes = 0;    // bytes read from the inputs
  std::string dtype;          // "uint16" or "uint32"
  int64_t vocab = 0;          // the tokenizer's vocab_size()
  double encode_seconds = 0;  // reading and encoding, without the final fsync
};

// "uint16" when every id of a vocabulary of `vocab` ids fits in 16 bits,
// else "uint32".
std::string token_dtype_for_vocab(int64_t vocab);

// Encodes `inputs` with `tokenizer` into `output`, atomically (a temporary
// file `<output>.tmp.<pid>`, fsynced and renamed; on any error it is removed
// and an existing `output` is left as it was). Documents are encoded on up to
// `threads` threads (0: one per hardware thread, at most one per document);
// the file holds them in input order. Throws kolos::DataError naming the
// input that cannot be read, when there are no inputs, when the tokenizer
// has no eos id and there is more than one document, or when the inputs give
// no tokens.
PreparedTokens prepare_token_file(const std::vector<std::string>& inputs, const std::string& output,
                                  const Tokenizer& tokenizer, int threads = 0);

}  // namespace kolos::tokenizer
