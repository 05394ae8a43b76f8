// `kolos data prepare`: text files as a token file for [data] kind =
// "tokens" (byte-level, or the ids of a tokenizer.json / tokenizer.model),
// or PNG/JPEG class folders or NumPy arrays as an HDF5 images file for
// [data] kind = "images" (docs/data.md).
#include "data_command.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "command_options.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"
#include "kolos/tokenizer/token_file.h"
#include "kolos/tokenizer/tokenizer.h"

namespace po = boost::program_options;

namespace kolos::cli {

int data_command(const std::vector<std::string>& args) {
  constexpr const char* kSynopsis =
      "FILE... -o OUT [--tokenizer PATH] | --images DIR -o OUT.h5 | --images X.npy --labels "
      "Y.npy -o OUT.h5";
  if (args.empty() || args[0] != "prepare") {
    if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
      std::cout << "usage: kolos data prepare " << kSynopsis << "\n";
      return 0;
    }
    throw UsageError("kolos data: expected `kolos data prepare FILE... -o OUT` or `kolos data "
                     "prepare --images DIR -o OUT.h5`");
  }
  po::options_description options("options");
  std::vector<std::string> inputs;
  std::string output, tokenizer_path, images_path, labels_path;
  options.add_options()("input", po::value(&inputs), "text files to tokenise")(
      "output,o", po::value(&output)->required(),
      "file to write: a token file (uint16, vocab 256; with --tokenizer uint16 or uint32), or "
      "with --images an HDF5 images file for [data] kind = \"images\"")(
      "tokenizer", po::value(&tokenizer_path),
      "tokenizer.json, tokenizer.model or a directory holding one: each FILE is one document, "
      "eos between documents (docs/data.md)")(
      "images", po::value(&images_path),
      "a folder with one subfolder of PNG/JPEG images per class (sorted names are labels "
      "0..K-1), or a .npy of uint8 images (N x H x W x C or N x H x W) with --labels")(
      "labels", po::value(&labels_path),
      "with --images X.npy: a .npy of N int64, int32 or uint8 labels");
  po::positional_options_description positional;
  positional.add("input", -1);
  Parsed parsed = parse("data prepare", {args.begin() + 1, args.end()}, options, positional,
                        kSynopsis);
  if (parsed.help) return 0;
  if (!images_path.empty()) {
    if (!inputs.empty() || !tokenizer_path.empty()) {
      throw UsageError("kolos data prepare: --images makes an images file; it takes no text "
                       "FILEs and no --tokenizer");
    }
    // Without --labels: a folder (prepare_images_from_folder says so when it is not one).
    if (!labels_path.empty() && std::filesystem::is_directory(images_path)) {
      throw UsageError("kolos data prepare: --labels goes with --images X.npy; a folder's labels "
                       "are its class subfolders");
    }
    const data::ImagesPrepared r =
        labels_path.empty() ? data::prepare_images_from_folder(images_path, output)
                            : data::prepare_images_from_npy(images_path, labels_path, output);
    std::cout << "kolos: wrote " << r.images << " images of " << r.height << "x" << r.width << "x"
              << r.channels << " and " << r.classes << " classes";
    if (!r.class_names.empty()) {
      std::cout << " (";
      for (size_t i = 0; i < r.class_names.size(); ++i) {
        std::cout << (i ? ", " : "") << i << " = " << r.class_names[i];
      }
      std::cout << ")";
    }
    std::cout << " to " << output << ": set model.image_size = " << r.height
              << ", model.channels = " << r.channels << ", model.classes >= " << r.classes
              << "\n";
    return 0;
  }
  if (!labels_path.empty()) {
    throw UsageError("kolos data prepare: --labels goes with --images X.npy");
  }
  if (inputs.empty()) {
    throw UsageError("kolos data prepare: no input files; give text FILEs to tokenise or "
                     "--images DIR (see `kolos data prepare --help`)");
  }
  if (!tokenizer_path.empty()) {
    const auto tok = tokenizer::open_tokenizer(tokenizer_path);
    const auto r = tokenizer::prepare_token_file(inputs, output, *tok);
    const double s = std::max(r.encode_seconds, 1e-9);
    auto fixed = [](double value, int digits) {
      std::ostringstream out;
      out.setf(std::ios::fixed);
      out.precision(digits);
      out << value;
      return out.str();
    };
    std::cout << "kolos: wrote " << r.tokens << " tokens (" << r.dtype << ", vocab " << r.vocab
              << ") from " << r.documents << " documents to " << output << ": set data.dtype = \""
              << r.dtype << "\" and model.vocab >= " << r.vocab << "\n"
              << "kolos: " << tok->description() << " " << tok->path() << ": " << r.input_bytes
              << " bytes in " << fixed(r.encode_seconds, 3) << " s, "
              << static_cast<int64_t>(r.tokens / s) << " tokens/s, "
              << fixed(r.input_bytes / s / 1e6, 2) << " MB/s\n";
    return 0;
  }
  int64_t tokens = data::prepare_byte_tokens(inputs, output);
  std::cout << "kolos: wrote " << tokens << " tokens (uint16, vocab 256) to " << output << "\n";
  return 0;
}

}  // namespace kolos::cli
