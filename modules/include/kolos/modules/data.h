// Training data: sources of fixed-length token samples.
//
// A sample is seq_len + 1 token ids (inputs are the first seq_len, targets
// the last seq_len). Samples are addressed by a global index, so that any
// data-parallel layout reads the same global batch: step s takes global
// indices [s*B, (s+1)*B) and each dp rank reads its own slice of them.
// Sources are deterministic functions of (seed, index) and are safe to call
// from several threads. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolos/core/data_source.h"
#include "kolos/core/run_config.h"

namespace kolos::data {

// TokenSource is declared in kolos/core/data_source.h (the engine reads it).

// Synthetic, learnable sequences: each sample is an arithmetic progression
// modulo the vocabulary with a start and stride drawn from (seed, index), so
// a model's loss falls quickly and visibly.
std::unique_ptr<TokenSource> make_synthetic_source(int64_t seq_len, int64_t vocab, uint64_t seed);

// A memory-mapped file of little-endian uint16 or uint32 token ids (nanoGPT's
// .bin layout). Windows of seq_len + 1 tokens at stride seq_len, visited in a
// per-epoch permutation drawn from `seed`. Throws DataError naming the file
// when it is missing, unreadable, not a whole number of tokens, shorter than
// one sample, or when a sample holds a token id >= vocab (naming its offset).
std::unique_ptr<TokenSource> make_token_file_source(const std::string& path,
                                                    const std::string& dtype, int64_t seq_len,
                                                    int64_t vocab, uint64_t seed);

// From a run's [data] and [model] sections.
std::unique_ptr<TokenSource> make_source(const RunConfig& config);

// `kolos data prepare`: byte-level tokens (ids 0..255) of the concatenated
// input files written as uint16 to `output` (atomically: temporary file, then
// rename). Returns the number of tokens written. Throws DataError naming the
// input that cannot be read.
int64_t prepare_byte_tokens(const std::vector<std::string>& inputs, const std::string& output);

}  // namespace kolos::data
