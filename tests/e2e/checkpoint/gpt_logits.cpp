// gpt_logits CKPT OUT BATCH TOKEN...
//
// kolos's own logits for the given tokens (BATCH rows of equal length): the
// checkpoint's gpt, built by the serial layer factory as a one-rank run
// builds it, with the checkpoint's weights copied in, run forward through
// Model::forward. Writes OUT as safetensors: "tokens" [BATCH, T] int64 and
// "logits" [BATCH, T, vocab] float32. The hf_gpt2 case compares them with
// transformers' GPT2LMHeadModel on `kolos ckpt export --format hf` output.
// Any model of the zoo runs: for a vit a row is one image, its TOKENs the
// packed float bits of its pixels (data::pack_pixel), and "logits" is
// [BATCH, classes] (hf_vit.sh).
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/error.h"
#include "kolos/core/model.h"
#include "kolos/core/run_config.h"
#include "kolos/modules/gpt.h"

int main(int argc, char** argv) {
  using namespace kolos;
  if (argc < 5) {
    std::cerr << "usage: gpt_logits CKPT OUT BATCH TOKEN...\n";
    return 2;
  }
  try {
    const std::string dir = argv[1], out = argv[2];
    const int64_t batch = std::stoll(argv[3]);
    std::vector<int64_t> ids;
    for (int i = 4; i < argc; ++i) ids.push_back(std::stoll(argv[i]));
    KOLOS_CHECK(batch > 0 && ids.size() % batch == 0, ids.size(), " tokens do not make ", batch,
                " rows");

    const checkpoint::ModelWeights weights = checkpoint::read_model_weights(dir);
    const RunConfig config = parse_run_config(weights.meta.config_toml, dir + " (config)");
    modules::register_builtin_models();
    auto factory = make_serial_layer_factory();
    std::shared_ptr<Model> model = build_model(config.model, *factory);

    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> by_name(weights.tensors.begin(), weights.tensors.end());
    for (const PlacedParameter& p : model->all_parameters()) {
      auto it = by_name.find(p.name);
      KOLOS_CHECK(it != by_name.end(), "the checkpoint has no tensor `", p.name, "`");
      p.tensor.copy_(it->second);
      by_name.erase(it);
    }
    KOLOS_CHECK(by_name.empty(), by_name.size(), " checkpoint tensors are not the model's");

    at::Tensor tokens = torch::tensor(ids, torch::kInt64).view({batch, -1});
    at::Tensor logits = model->forward(tokens);
    checkpoint::write_safetensors(out, {{"tokens", tokens}, {"logits", logits}},
                                  {{"format", "pt"}});
    std::cout << "gpt_logits: " << logits.sizes() << " from " << dir << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt_logits: " << e.what() << "\n";
    return 1;
  }
}
