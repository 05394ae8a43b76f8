// make_source: the data source a run's configuration asks for.
#include "kolos/core/error.h"
#include "kolos/modules/data.h"

namespace kolos::data {

std::unique_ptr<TokenSource> make_source(const RunConfig& config) {
  const DataConfig& data = config.data;
  const std::string where = config.source.empty() ? std::string("the run config") : config.source;
  const ModelConfig& m = config.model;
  if (m.name == "dit" && (data.kind == "images" || data.kind == "synthetic")) {
    // The same images as a vit would read, each with its noise key.
    RunConfig images = config;
    images.model.name = "vit";
    images.model.seq_len = m.image_size * m.image_size * m.channels;
    return make_diffusion_source(make_source(images), config.train.seed);
  }
  if (data.kind == "images") {
    if (data.path.empty()) throw DataError(where + ": data.kind = \"images\" needs data.path");
    try {
      return make_image_file_source(data.path, m.image_size, m.channels, m.classes,
                                    ImageTransform{data.mean, data.std, data.crop_pad, data.flip},
                                    config.train.seed);
    } catch (const DataError& e) {
      throw DataError(std::string("data.path: ") + e.what());  // the key that names the file
    }
  }
  if (data.kind == "synthetic" && m.name == "vit") {
    return make_synthetic_image_source(m.image_size, m.channels, m.classes, config.train.seed);
  }
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
                  "\"; valid: \"synthetic\", \"tokens\", \"images\"");
}

}  // namespace kolos::data
