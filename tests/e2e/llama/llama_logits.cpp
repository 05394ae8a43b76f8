// llama_logits OUT [KEY=VALUE...]
//
// kolos's LLaMA forward for an independent check: the model of
// `[model] name = "llama"` with the given overrides (--set syntax), built by
// the serial layer factory, its initial weights perturbed (the RMSNorm
// weights start at one, which would hide a norm that ignores its weight),
// run forward on a fixed batch of token ids. Writes OUT as safetensors:
// every parameter under its kolos name, "tokens" [2, seq_len] int64 and
// "logits" [2, seq_len, vocab] float32, and the config's model keys as
// metadata. llama_reference.py recomputes the logits from those weights.
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/model.h"
#include "kolos/core/run_config.h"
#include "kolos/modules/gpt.h"

int main(int argc, char** argv) {
  using namespace kolos;
  if (argc < 2) {
    std::cerr << "usage: llama_logits OUT [KEY=VALUE...]\n";
    return 2;
  }
  try {
    std::vector<std::string> overrides(argv + 2, argv + argc);
    const RunConfig config =
        parse_run_config("[model]\nname = \"llama\"\n", "<llama_logits>", overrides);
    const ModelConfig& m = config.model;
    modules::register_builtin_models();
    torch::manual_seed(11);
    auto factory = make_serial_layer_factory();
    std::shared_ptr<Model> model = build_model(m, *factory);

    torch::NoGradGuard no_grad;
    checkpoint::NamedTensors tensors;
    for (const PlacedParameter& p : model->all_parameters()) {
      p.tensor.add_(torch::randn_like(p.tensor) * 0.05);
      tensors.emplace_back(p.name, p.tensor.clone());
    }
    at::Tensor tokens = torch::randint(m.vocab, {2, m.seq_len}, torch::kInt64);
    at::Tensor logits = model->forward(tokens);
    tensors.emplace_back("tokens", tokens);
    tensors.emplace_back("logits", logits.contiguous());
    checkpoint::write_safetensors(argv[1], tensors,
                                  {{"layers", std::to_string(m.layers)},
                                   {"hidden", std::to_string(m.hidden)},
                                   {"heads", std::to_string(m.heads)},
                                   {"kv_heads", std::to_string(m.kv_heads)},
                                   {"ffn_hidden", std::to_string(m.ffn_hidden)},
                                   {"vocab", std::to_string(m.vocab)},
                                   {"seq_len", std::to_string(m.seq_len)},
                                   {"rope_theta", format_float(m.rope_theta)},
                                   {"norm_eps", format_float(m.norm_eps)}});
    std::cout << "llama_logits: " << logits.sizes() << " -> " << argv[1] << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "llama_logits: " << e.what() << "\n";
    return 1;
  }
}
