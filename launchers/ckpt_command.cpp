// `kolos ckpt inspect|verify|export|import`: look into a checkpoint without
// MPI or a model. DIR is a checkpoint directory (step-N) or a checkpoint
// root, whose `latest` file names one. `export --format hf` converts a gpt's,
// llama's or vit's weights to Hugging Face GPT-2's, LLaMA's or ViT's names
// and layouts, `import --format hf` the other way (kolos/modules/hf.h).
#include "ckpt_command.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/error.h"
#include "kolos/core/run_config.h"
#include "kolos/modules/hf.h"

namespace kolos::cli {

namespace {

constexpr const char* kCkptUsage = R"(usage: kolos ckpt <inspect|verify|export|import> DIR [options]

  inspect DIR                                  tensors, shapes, dtypes, step, the writing mesh
  verify DIR                                   every checksum, shard and piece; exit 1 if damaged
  export DIR --format safetensors -o FILE      the global model weights as one safetensors file
  export DIR --format hf -o OUTDIR             a gpt, llama or vit model as Hugging Face GPT-2,
                                               LLaMA or ViT (GPT2LMHeadModel, LlamaForCausalLM,
                                               ViTForImageClassification):
                                               OUTDIR/model.safetensors and OUTDIR/config.json
  import HFDIR --format hf -o ROOT             a Hugging Face GPT-2, LLaMA or ViT directory
                                               (config.json and model.safetensors, or the
                                               shards that model.safetensors.index.json names)
                                               as a step-0 checkpoint in ROOT (zero optimizer
                                               state) that `kolos train CONFIG --resume ROOT`
                                               starts from;
                                               prints the [model] table CONFIG needs

DIR is a checkpoint (a step-N directory) or a checkpoint root (its `latest`).
)";

// The [model] table of `toml` (to_toml's rendering), for the user's config.
std::string model_table(const std::string& toml) {
  std::istringstream in(toml);
  std::string line, table;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '[') inside = line == "[model]";
    if (inside && !line.empty()) table += line + "\n";
  }
  return table;
}

int import_hf(const std::string& dir, const std::string& format, const std::string& out) {
  if (format != "hf") {
    throw UsageError("kolos ckpt import: unknown --format `" + format + "`; valid: hf");
  }
  if (out.empty()) throw UsageError("kolos ckpt import: missing -o ROOT (the checkpoint root)");
  std::ifstream config_file(dir + "/config.json");
  if (!config_file) throw Error(dir + "/config.json: cannot be read", ErrorKind::kCheckpoint);
  const std::string config_json((std::istreambuf_iterator<char>(config_file)),
                                std::istreambuf_iterator<char>());
  const modules::ImportedModel imported =
      modules::from_hf(config_json, checkpoint::read_safetensors_dir(dir), dir);
  RunConfig config;
  config.model = imported.model;
  // The recorded configuration must read back as this model (run_config's checks).
  const std::string toml = to_toml(config);
  parse_run_config(toml, dir + " (imported config)");
  const std::string written = checkpoint::write_initial_checkpoint(out, imported.weights, toml);
  for (const std::string& note : imported.notes) std::cerr << "kolos: note: " << note << "\n";
  std::cout << "kolos: imported " << imported.architecture << " from " << dir << " ("
            << imported.weights.size() << " tensors) as " << written << "\n"
            << "kolos: start from it with `kolos train CONFIG --resume " << out
            << "` (any mesh), CONFIG having this [model]:\n\n"
            << model_table(toml);
  return 0;
}

}  // namespace

int ckpt_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kCkptUsage;
    return args.empty() ? 2 : 0;
  }
  const std::string sub = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  std::string dir, format = "safetensors", out;
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    if (a == "--help" || a == "-h") {
      std::cout << kCkptUsage;
      return 0;
    }
    if ((a == "--format" || a == "-o" || a == "--output") && i + 1 < rest.size()) {
      (a == "--format" ? format : out) = rest[++i];
    } else if (a.rfind("--format=", 0) == 0) {
      format = a.substr(9);
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError("kolos ckpt " + sub + ": unknown option `" + a + "`");
    } else if (dir.empty()) {
      dir = a;
    } else {
      throw UsageError("kolos ckpt " + sub + ": unexpected argument `" + a + "`");
    }
  }
  if (dir.empty()) throw UsageError("kolos ckpt " + sub + ": missing DIR (see `kolos ckpt --help`)");

  if (sub == "inspect") {
    std::cout << checkpoint::format_inspection(checkpoint::inspect(dir));
    return 0;
  }
  if (sub == "verify") {
    const std::string resolved = checkpoint::resolve(dir);
    const auto problems = checkpoint::verify(resolved);
    for (const auto& p : problems) std::cerr << "kolos: checkpoint: " << p << "\n";
    if (!problems.empty()) {
      std::cerr << "kolos: " << resolved << ": " << problems.size() << " problem"
                << (problems.size() == 1 ? "" : "s") << "\n";
      return 1;
    }
    std::cout << "kolos: " << resolved << ": ok (every checksum, shard and piece)\n";
    return 0;
  }
  if (sub == "import") return import_hf(dir, format, out);
  if (sub == "export") {
    if (format != "safetensors" && format != "hf") {
      throw UsageError("kolos ckpt export: unknown --format `" + format +
                       "`; valid: safetensors, hf");
    }
    if (out.empty()) {
      throw UsageError(std::string("kolos ckpt export: missing -o ") +
                       (format == "hf" ? "OUTDIR" : "FILE"));
    }
    if (format == "safetensors") {
      const int64_t n = checkpoint::export_safetensors(dir, out);
      std::cout << "kolos: wrote " << n << " tensors to " << out << "\n";
      return 0;
    }
    // The model's shape comes from the configuration the checkpoint recorded.
    const checkpoint::ModelWeights weights = checkpoint::read_model_weights(dir);
    const RunConfig config =
        parse_run_config(weights.meta.config_toml, checkpoint::resolve(dir) + "/index.h5 (config)");
    const modules::HfModel hf = modules::to_hf(config.model, weights.tensors);
    std::filesystem::create_directories(out);
    checkpoint::write_safetensors(out + "/model.safetensors", hf.tensors,
                                  {{"format", "pt"},
                                   {"kolos.step", std::to_string(weights.meta.step)},
                                   {"kolos.version", weights.meta.kolos_version}});
    std::ofstream json(out + "/config.json", std::ios::trunc);
    json << hf.config_json;
    json.close();
    if (!json) throw Error("cannot write " + out + "/config.json");
    std::cout << "kolos: wrote " << hf.architecture << " (" << hf.tensors.size()
              << " tensors, step " << weights.meta.step << ") to " << out
              << "/ (transformers: " << hf.architecture << ".from_pretrained)\n";
    return 0;
  }
  throw UsageError("kolos ckpt: unknown subcommand `" + sub +
                   "`; valid: inspect, verify, export, import");
}

}  // namespace kolos::cli
