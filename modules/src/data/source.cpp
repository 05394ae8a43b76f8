// make_source: the data source a run's configuration asks for.
#include "kolos/core/error.h"
#include "kolos/modules/data.h"

namespace kolos::data {

std::unique_ptr<TokenSource> make_source(const RunConfig& config) {
  const DataConfig& data = config.data;
  const std::string where = config.source.empty() ? std::string("the run config") : config.source;
  if (data.kind == "synthetic") {
    return make_synthetic_source(config.model.seq_len, config.model.vocab, config.train.seed);
  }
  if (data.kind == "tokens") {
    if (data.path.empty()) {
      throw DataError(where +
                      ": data.kind = \"tokens\" needs data.path, a file of token ids "
                      "(make one with `kolos data prepare FILE... -o out.bin`)");
    }
    return make_token_file_source(data.path, data.dtype, config.model.seq_len, config.model.vocab,
                                  config.train.seed);
  }
  throw DataError(where + ": unknown data.kind \"" + data.kind +
                  "\"; valid: \"synthetic\", \"tokens\"");
}

}  // namespace kolos::data
