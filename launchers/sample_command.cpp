// `kolos sample CKPT --classes 0,1,2 -o grid.png`: the reverse diffusion
// process of a DiT checkpoint (model.name = "dit", saved under any layout:
// the global weights are read whole), run serially in this process, one row
// of the PNG grid per class. No MPI.
#include "sample_command.h"

#if KOLOS_WITH_PNG
#include <png.h>
#endif
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/error.h"
#include "kolos/core/model.h"
#include "kolos/core/run_config.h"
#include "kolos/modules/dit.h"
#include "kolos/modules/gpt.h"

namespace kolos::cli {
namespace {

constexpr const char* kSampleUsage =
    R"(usage: kolos sample CKPT --classes LIST -o FILE.png [options]

  CKPT               a checkpoint of a model.name = "dit" run (a step-N directory or a root whose
                     `latest` names one), saved under any layout
  --classes LIST     the classes to draw, comma-separated (0,1,2); one row of the grid each
  -o, --output FILE  the PNG grid to write
  --per-class N      images per class, the grid's columns (default 8)
  --steps N          timesteps visited, evenly spaced over model.diffusion_steps (default 50)
  --sampler NAME     ddim (deterministic given the seed) or ddpm (default ddim)
  --cfg-scale S      classifier-free guidance scale; 1 = none (default 1; > 1 needs a model
                     trained with model.class_dropout > 0)
  --seed S           the seed of the starting noise (and of ddpm's) (default 0)
  --scale K          each pixel drawn as K x K (default: tiles of at least 64 pixels)

Runs on this process's CPU, no MPI. The pixels are mapped back with the run's data.mean and
data.std and clipped to [0, 255].
)";

struct Options {
  std::string checkpoint, output;
  std::vector<int64_t> classes;
  int64_t per_class = 8;
  int64_t scale = 0;
  modules::DitSampling sampling;
};

int64_t parse_int(const std::string& option, const std::string& text, int64_t min,
                  int64_t max) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v >= min && v <= max) return v;
  } catch (const std::exception&) {
  }
  throw UsageError("kolos sample: " + option + " `" + text + "`: expected an integer in " +
                   std::to_string(min) + ".." + std::to_string(max));
}

double parse_number(const std::string& option, const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && std::isfinite(v) && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw UsageError("kolos sample: " + option + " `" + text + "`: expected a finite number >= 0");
}

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  bool have_classes = false;
  auto value = [&](size_t& i, const std::string& name) -> std::string {
    const std::string& a = args[i];
    const auto eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) return a.substr(eq + 1);
    if (i + 1 >= args.size()) throw UsageError("kolos sample: " + name + " needs a value");
    return args[++i];
  };
  auto is = [](const std::string& a, const std::string& name) {
    return a == name || a.rfind(name + "=", 0) == 0;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string a = args[i];
    if (is(a, "--classes")) {
      const std::string list = value(i, "--classes");
      have_classes = true;
      std::string token;
      for (size_t k = 0; k <= list.size(); ++k) {
        if (k == list.size() || list[k] == ',') {
          if (token.empty()) {
            throw UsageError("kolos sample: --classes `" + list +
                             "`: expected class numbers separated by commas (0,1,2)");
          }
          o.classes.push_back(parse_int("--classes", token, 0, INT64_MAX));
          token.clear();
        } else if (list[k] != ' ') {
          token += list[k];
        }
      }
    } else if (a == "-o" || is(a, "--output")) {
      o.output = value(i, "-o");
    } else if (is(a, "--per-class")) {
      o.per_class = parse_int("--per-class", value(i, "--per-class"), 1, 1024);
    } else if (is(a, "--steps")) {
      o.sampling.steps = parse_int("--steps", value(i, "--steps"), 1, 100000);
    } else if (is(a, "--sampler")) {
      o.sampling.sampler = value(i, "--sampler");
      if (o.sampling.sampler != "ddim" && o.sampling.sampler != "ddpm") {
        throw UsageError("kolos sample: --sampler `" + o.sampling.sampler +
                         "`: expected ddim or ddpm");
      }
    } else if (is(a, "--cfg-scale")) {
      o.sampling.cfg_scale = parse_number("--cfg-scale", value(i, "--cfg-scale"));
    } else if (is(a, "--seed")) {
      o.sampling.seed =
          static_cast<uint64_t>(parse_int("--seed", value(i, "--seed"), 0, INT64_MAX));
    } else if (is(a, "--scale")) {
      o.scale = parse_int("--scale", value(i, "--scale"), 1, 64);
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError("kolos sample: unknown option `" + a + "` (see `kolos sample --help`)");
    } else if (o.checkpoint.empty()) {
      o.checkpoint = a;
    } else {
      throw UsageError("kolos sample: unexpected argument `" + a + "`");
    }
  }
  if (o.checkpoint.empty()) throw UsageError("kolos sample: missing CKPT (see `kolos sample --help`)");
  if (!have_classes) throw UsageError("kolos sample: missing --classes (e.g. --classes 0,1,2)");
  if (o.output.empty()) throw UsageError("kolos sample: missing -o FILE.png");
  return o;
}

#if KOLOS_WITH_PNG
// Closes the file and frees libpng's state whatever happens.
class PngWriter {
 public:
  explicit PngWriter(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "wb")) {
    if (!file_) throw Error("-o " + path + ": cannot be opened for writing");
    png_ = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
    if (png_) info_ = png_create_info_struct(png_);
    if (!png_ || !info_) throw Error("-o " + path + ": libpng could not start");
  }
  ~PngWriter() {
    if (png_) png_destroy_write_struct(&png_, info_ ? &info_ : nullptr);
    if (file_) std::fclose(file_);
  }
  PngWriter(const PngWriter&) = delete;
  PngWriter& operator=(const PngWriter&) = delete;

  // rows: height rows of width * channels bytes.
  void write(int64_t width, int64_t height, int channels, std::vector<uint8_t>& pixels) {
    const int type = channels == 1   ? PNG_COLOR_TYPE_GRAY
                     : channels == 3 ? PNG_COLOR_TYPE_RGB
                                     : PNG_COLOR_TYPE_RGB_ALPHA;
    std::vector<png_bytep> rows(static_cast<size_t>(height));
    for (int64_t y = 0; y < height; ++y)
      rows[static_cast<size_t>(y)] = pixels.data() + y * width * channels;
    if (setjmp(png_jmpbuf(png_))) throw Error("-o " + path_ + ": libpng failed while writing");
    png_init_io(png_, file_);
    png_set_IHDR(png_, info_, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
                 type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png_, info_);
    png_write_image(png_, rows.data());
    png_write_end(png_, nullptr);
    if (std::fflush(file_) != 0) throw Error("-o " + path_ + ": write failed");
  }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};
#else
// Built without libpng (see launchers/CMakeLists.txt).
class PngWriter {
 public:
  explicit PngWriter(const std::string&) {
    throw Error(
        "kolos sample: this kolos was built without libpng, so it cannot write PNG files; "
        "install libpng-dev (scripts/install-deps.sh) and rebuild");
  }
  void write(int64_t, int64_t, int, std::vector<uint8_t>&) {}
};
#endif

}  // namespace

int sample_command(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << kSampleUsage;
      return 0;
    }
  }
  const Options o = parse_options(args);
#if !KOLOS_WITH_PNG
  PngWriter refuse(o.output);  // throws: built without libpng
#endif
  const std::string dir = checkpoint::resolve(o.checkpoint);
  const checkpoint::ModelWeights weights = checkpoint::read_model_weights(dir);
  if (weights.meta.config_toml.empty()) {
    throw Error(dir + "/index.h5: records no configuration, so its model is unknown",
                ErrorKind::kCheckpoint);
  }
  const RunConfig config = parse_run_config(weights.meta.config_toml, dir + "/index.h5 (config)");
  const ModelConfig& m = config.model;
  if (m.name != "dit") {
    throw ConfigError(dir + ": model.name = \"" + m.name +
                      "\" is not a diffusion model; kolos sample draws images from a model.name "
                      "= \"dit\" checkpoint");
  }
  for (const int64_t c : o.classes) {
    if (c >= m.classes) {
      throw ConfigError("--classes: class " + std::to_string(c) + " is outside the model's " +
                        "classes 0.." + std::to_string(m.classes - 1) + " (model.classes = " +
                        std::to_string(m.classes) + ")");
    }
  }
  if (o.sampling.steps > m.diffusion_steps) {
    throw ConfigError("--steps " + std::to_string(o.sampling.steps) + ": at most the model's " +
                      std::to_string(m.diffusion_steps) + " (model.diffusion_steps)");
  }
  if (o.sampling.cfg_scale != 1.0 && m.class_dropout <= 0) {
    throw ConfigError("--cfg-scale " + std::to_string(o.sampling.cfg_scale) +
                      ": the model was trained with model.class_dropout = 0, so it has no "
                      "unconditional prediction; use --cfg-scale 1");
  }
  if (m.channels != 1 && m.channels != 3 && m.channels != 4) {
    throw ConfigError(dir + ": model.channels = " + std::to_string(m.channels) +
                      "; a PNG holds 1 (gray), 3 (RGB) or 4 (RGBA) channels");
  }

  // The model, serially, with the checkpoint's global weights.
  modules::register_builtin_models();
  auto factory = make_serial_layer_factory();
  std::shared_ptr<Model> model = build_model(m, *factory);
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> by_name(weights.tensors.begin(), weights.tensors.end());
    for (const PlacedParameter& p : model->all_parameters()) {
      auto it = by_name.find(p.name);
      if (it == by_name.end() || it->second.sizes() != p.tensor.sizes()) {
        throw Error(dir + ": the checkpoint has no tensor `model/" + p.name + "` of shape " +
                        c10::str(p.tensor.sizes()) + " (is it a dit of another shape?)",
                    ErrorKind::kCheckpoint);
      }
      p.tensor.copy_(it->second);
    }
  }
  model->eval();

  std::vector<int64_t> labels;
  for (const int64_t c : o.classes)
    for (int64_t k = 0; k < o.per_class; ++k) labels.push_back(c);
  modules::DitSampling sampling = o.sampling;
  // Clip the predicted clean image to the range normalised pixels can take.
  sampling.clip_min = (0.0 - config.data.mean) / config.data.std;
  sampling.clip_max = (1.0 - config.data.mean) / config.data.std;
  const at::Tensor images = modules::dit_sample(*model, m, labels, sampling);  // [N, H, W, C]
  const at::Tensor bytes = (images * config.data.std + config.data.mean)
                               .mul(255.0)
                               .round()
                               .clamp(0, 255)
                               .to(at::kByte)
                               .contiguous();

  // The grid: one row per class, per_class columns, a 1-pixel gap.
  const int64_t side = m.image_size, ch = m.channels;
  const int64_t scale = o.scale > 0 ? o.scale : std::max<int64_t>(1, (64 + side - 1) / side);
  const int64_t tile = side * scale, gap = 1;
  const int64_t cols = o.per_class, rows = static_cast<int64_t>(o.classes.size());
  const int64_t width = cols * tile + (cols - 1) * gap, height = rows * tile + (rows - 1) * gap;
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * ch), 128);  // gray gaps
  const uint8_t* src = bytes.data_ptr<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t* image = src + (r * cols + c) * side * side * ch;
      for (int64_t y = 0; y < tile; ++y) {
        for (int64_t x = 0; x < tile; ++x) {
          const uint8_t* from = image + ((y / scale) * side + x / scale) * ch;
          uint8_t* to = pixels.data() + ((r * (tile + gap) + y) * width + c * (tile + gap) + x) * ch;
          std::copy(from, from + ch, to);
        }
      }
    }
  }
  PngWriter(o.output).write(width, height, static_cast<int>(ch), pixels);
  std::cout << "kolos: wrote " << o.output << " (" << width << "x" << height << ", " << rows
            << " class" << (rows == 1 ? "" : "es") << " x " << cols << ", " << o.sampling.steps
            << " " << o.sampling.sampler << " steps, cfg scale " << o.sampling.cfg_scale
            << ", from step " << weights.meta.step << ")\n";
  return 0;
}

}  // namespace kolos::cli
