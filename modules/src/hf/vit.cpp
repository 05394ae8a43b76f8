// vit <-> ViT (ViTForImageClassification); the table is in kolos/modules/hf.h.
#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "hf_detail.h"
#include "kolos/core/error.h"
#include "kolos/core/settings.h"  // format_float

namespace kolos::modules {
namespace {

using hf_detail::TensorName;

// (kolos name, Hugging Face name) of every tensor whose layout the two
// share (nn::Linear's [out, in], LayerNorm vectors), with its shape. The
// patch projection, the class token, the positions and the classifier's
// bias are converted apart.
std::vector<TensorName> vit_block_names(const ModelConfig& c) {
  const int64_t h = c.hidden, inner = c.mlp_ratio * c.hidden;
  std::vector<TensorName> out;
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string k = "h." + std::to_string(i) + ".";
    const std::string l = "vit.encoder.layer." + std::to_string(i) + ".";
    for (const char* p : {"weight", "bias"}) {
      const std::string s = p;
      const bool w = s == "weight";
      out.push_back({k + "ln_1." + s, l + "layernorm_before." + s, {h}});
      out.push_back({k + "attn.q_proj." + s, l + "attention.attention.query." + s,
                     w ? std::vector<int64_t>{h, h} : std::vector<int64_t>{h}});
      out.push_back({k + "attn.k_proj." + s, l + "attention.attention.key." + s,
                     w ? std::vector<int64_t>{h, h} : std::vector<int64_t>{h}});
      out.push_back({k + "attn.v_proj." + s, l + "attention.attention.value." + s,
                     w ? std::vector<int64_t>{h, h} : std::vector<int64_t>{h}});
      out.push_back({k + "attn.o_proj." + s, l + "attention.output.dense." + s,
                     w ? std::vector<int64_t>{h, h} : std::vector<int64_t>{h}});
      out.push_back({k + "ln_2." + s, l + "layernorm_after." + s, {h}});
      out.push_back({k + "mlp.up_proj." + s, l + "intermediate.dense." + s,
                     w ? std::vector<int64_t>{inner, h} : std::vector<int64_t>{inner}});
      out.push_back({k + "mlp.down_proj." + s, l + "output.dense." + s,
                     w ? std::vector<int64_t>{h, inner} : std::vector<int64_t>{h}});
    }
  }
  out.push_back({"head.ln_f.weight", "vit.layernorm.weight", {h}});
  out.push_back({"head.ln_f.bias", "vit.layernorm.bias", {h}});
  out.push_back({"head.classifier.weight", "classifier.weight", {c.classes, h}});
  return out;
}

int64_t vit_tokens(const ModelConfig& c) {
  const int64_t side = c.image_size / c.patch_size;
  return side * side + 1;
}

}  // namespace

HfModel vit_to_hf_vit(const ModelConfig& c, const NamedTensors& weights) {
  KOLOS_CHECK_KIND(kConfig, c.name == "vit", "model `", c.name, "` is not a vit");
  KOLOS_CHECK_KIND(kConfig, c.activation == "gelu" || c.activation == "gelu_tanh",
                   "model.activation = \"", c.activation, "\" has no ViT hidden_act");
  hf_detail::Tensors left(weights, "the checkpoint");
  const int64_t h = c.hidden, p = c.patch_size, ch = c.channels;
  HfModel hf;
  hf.architecture = "ViTForImageClassification";
  auto put = [&](const std::string& name, const at::Tensor& t) {
    hf.tensors.emplace_back(name, t.contiguous());
  };
  // kolos flattens a patch as (row, column, channel) of HWC pixels; the
  // Conv2d's weight is [out, channel, row, column].
  put("vit.embeddings.patch_embeddings.projection.weight",
      left.take("embed.patch_proj.weight", {h, p * p * ch})
          .view({h, p, p, ch})
          .permute({0, 3, 1, 2}));
  put("vit.embeddings.patch_embeddings.projection.bias", left.take("embed.patch_proj.bias", {h}));
  put("vit.embeddings.cls_token", left.take("embed.cls_token", {h}).view({1, 1, h}));
  put("vit.embeddings.position_embeddings",
      left.take("embed.pos_embed", {vit_tokens(c), h}).unsqueeze(0));
  for (const TensorName& n : vit_block_names(c)) put(n.hf, left.take(n.kolos, n.shape));
  // kolos's head has no bias; the classifier's is zero.
  put("classifier.bias", torch::zeros({c.classes}, torch::kFloat));
  left.expect_empty(
      "ViT", "is this checkpoint's model a vit with layers = " + std::to_string(c.layers) + "?");

  std::ostringstream json;
  hf_detail::open_config(json, hf.architecture, "vit");
  json << "  \"image_size\": " << c.image_size << ",\n"
       << "  \"patch_size\": " << c.patch_size << ",\n"
       << "  \"num_channels\": " << c.channels << ",\n"
       << "  \"hidden_size\": " << c.hidden << ",\n"
       << "  \"num_hidden_layers\": " << c.layers << ",\n"
       << "  \"num_attention_heads\": " << c.heads << ",\n"
       << "  \"intermediate_size\": " << c.mlp_ratio * c.hidden << ",\n"
       << "  \"hidden_act\": \"" << (c.activation == "gelu" ? "gelu" : "gelu_pytorch_tanh")
       << "\",\n"
       << "  \"layer_norm_eps\": " << format_float(c.norm_eps) << ",\n"
       << "  \"qkv_bias\": true,\n"
       << "  \"hidden_dropout_prob\": 0.0,\n"
       << "  \"attention_probs_dropout_prob\": 0.0,\n"
       << "  \"encoder_stride\": " << c.patch_size << ",\n"
       << "  \"initializer_range\": " << c.init_std << ",\n"
       << "  \"problem_type\": \"single_label_classification\",\n";
  // kolos's classes have numbers, not names.
  json << "  \"id2label\": {";
  for (int64_t i = 0; i < c.classes; ++i) {
    json << (i ? ", " : "") << "\"" << i << "\": \"LABEL_" << i << "\"";
  }
  json << "},\n  \"label2id\": {";
  for (int64_t i = 0; i < c.classes; ++i) {
    json << (i ? ", " : "") << "\"LABEL_" << i << "\": " << i;
  }
  json << "},\n";
  hf.config_json = hf_detail::close_config(json);
  return hf;
}

namespace hf_detail {

ImportedModel vit_from_hf(const Config& config, const NamedTensors& tensors) {
  ImportedModel out;
  out.architecture = "ViTForImageClassification";
  ModelConfig& c = out.model;
  c.name = "vit";
  c.hidden = config.integer("hidden_size", 768);
  c.layers = config.integer("num_hidden_layers", 12);
  c.heads = config.integer("num_attention_heads", 12);
  c.image_size = config.integer("image_size", 224);
  c.patch_size = config.integer("patch_size", 16);
  c.channels = config.integer("num_channels", 3);
  c.init_std = config.number("initializer_range", c.init_std);
  check_sizes(config, c, {"hidden_size", "num_hidden_layers", "num_attention_heads"});
  if (c.image_size <= 0 || c.patch_size <= 0 || c.image_size % c.patch_size != 0) {
    config.refuse("patch_size", "kolos's vit cuts image_size = " + std::to_string(c.image_size) +
                                    " into whole square patches; patch_size must divide it");
  }
  if (c.channels <= 0) config.refuse("num_channels", "must be positive");
  const int64_t inner = config.integer("intermediate_size", 3072);
  if (inner <= 0 || inner % c.hidden != 0) {
    config.refuse("intermediate_size",
                  "kolos's vit has an MLP of model.mlp_ratio x hidden; it is not a multiple of "
                  "hidden_size = " +
                      std::to_string(c.hidden));
  }
  c.mlp_ratio = inner / c.hidden;
  // The classes: id2label's entries (what save_pretrained writes), else num_labels.
  const bool named = config.has("id2label");
  c.classes = named ? static_cast<int64_t>(config.object("id2label").size())
                    : config.integer("num_labels", 2);
  if (named && config.has("num_labels") && config.integer("num_labels") != c.classes) {
    config.refuse("num_labels", "id2label has " + std::to_string(c.classes) + " entries");
  }
  if (c.classes < 2) {
    config.refuse(named ? "id2label" : "num_labels",
                  "kolos's vit is a classifier over model.classes >= 2 labels");
  }
  const std::string problem = config.string("problem_type", "single_label_classification");
  if (problem != "single_label_classification") {
    config.refuse("problem_type",
                  "kolos's vit trains one label per image with cross-entropy "
                  "(\"single_label_classification\")");
  }
  // The MLP's activation: exact GELU (ViTConfig's default) or its tanh form;
  // anything else would load and compute another function.
  const std::string act = config.string("hidden_act", "gelu");
  if (act == "gelu") {
    c.activation = "gelu";
  } else if (act == "gelu_pytorch_tanh" || act == "gelu_new") {
    c.activation = "gelu_tanh";
  } else {
    config.refuse("hidden_act",
                  "kolos's vit computes exact GELU (\"gelu\", model.activation = \"gelu\") or "
                  "its tanh approximation (\"gelu_pytorch_tanh\" or \"gelu_new\", "
                  "model.activation = \"gelu_tanh\"); other activations are not implemented");
  }
  c.norm_eps = config.number("layer_norm_eps", 1e-12);
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps)) {
    config.refuse("layer_norm_eps", "kolos's vit needs a LayerNorm eps > 0 (model.norm_eps)");
  }
  const bool qkv_bias = config.boolean("qkv_bias", true);
  c.seq_len = c.image_size * c.image_size * c.channels;
  c.vocab = c.classes;

  // ViTForImageClassification saves the backbone under "vit."; a bare
  // ViTModel without it (and then has no classifier, refused below).
  NamedTensors renamed;
  for (const auto& [name, t] : tensors) {
    const bool head = name.rfind("classifier.", 0) == 0 || name.rfind("vit.", 0) == 0;
    renamed.emplace_back(head ? name : "vit." + name, t);
  }
  const std::string dir = config.where().substr(0, config.where().rfind('/'));
  Tensors left(renamed, dir + " (safetensors)");
  if (!left.has("classifier.weight")) {
    throw Error(dir +
                    ": no tensor `classifier.weight`: kolos imports ViTForImageClassification "
                    "(a backbone with its classification head), and this model has no head "
                    "(ViTModel, or ViTForMaskedImageModeling?)",
                ErrorKind::kCheckpoint);
  }
  const int64_t h = c.hidden, p = c.patch_size, ch = c.channels;
  auto put = [&](const std::string& name, const at::Tensor& t) {
    out.weights.emplace_back(name, t.to(at::kFloat).contiguous());
  };
  // Conv2d's [out, channel, row, column] to the linear layer over patches
  // flattened as (row, column, channel), the order of kolos's HWC pixels.
  put("embed.patch_proj.weight",
      left.take("vit.embeddings.patch_embeddings.projection.weight", {h, ch, p, p})
          .permute({0, 2, 3, 1})
          .reshape({h, p * p * ch}));
  put("embed.patch_proj.bias", left.take("vit.embeddings.patch_embeddings.projection.bias", {h}));
  put("embed.cls_token", left.take("vit.embeddings.cls_token", {1, 1, h}).view({h}));
  put("embed.pos_embed", left.take("vit.embeddings.position_embeddings", {1, vit_tokens(c), h})
                             .view({vit_tokens(c), h}));
  at::Tensor ln_f_bias, classifier;
  for (const TensorName& n : vit_block_names(c)) {
    const bool qkv_bias_name = n.kolos.find(".attn.o_proj.") == std::string::npos &&
                               n.kolos.find(".attn.") != std::string::npos &&
                               n.kolos.find(".bias") != std::string::npos;
    const at::Tensor t = qkv_bias_name && !qkv_bias ? torch::zeros(n.shape, torch::kFloat)
                                                    : left.take(n.hf, n.shape).to(at::kFloat);
    if (n.kolos == "head.ln_f.bias") ln_f_bias = t;
    if (n.kolos == "head.classifier.weight") classifier = t;
    put(n.kolos, t);
  }
  if (!qkv_bias) {
    out.notes.push_back(
        "config.json has qkv_bias = false; kolos's vit has query, key and value biases, so they "
        "start at zero (the same function) and train from there");
  }
  // kolos's head has no bias. logits = W ln_f(x) + b equals W (ln_f(x) + d)
  // when W d = b, so a non-zero bias moves into the final LayerNorm's bias
  // (d = pinv(W) b, exact when W has full row rank, classes <= hidden).
  const at::Tensor bias = left.take("classifier.bias", {c.classes}).to(at::kDouble);
  if (bias.abs().max().item<double>() != 0.0) {
    const at::Tensor w = classifier.to(at::kDouble);
    const at::Tensor d = torch::matmul(torch::linalg_pinv(w), bias);
    const at::Tensor folded = (ln_f_bias.to(at::kDouble) + d).to(at::kFloat);
    // What the fp32 weights give against what the model computed.
    const at::Tensor got = torch::matmul(w, folded.to(at::kDouble));
    const at::Tensor want = torch::matmul(w, ln_f_bias.to(at::kDouble)) + bias;
    const double error = (got - want).abs().max().item<double>();
    const double scale = 1.0 + want.abs().max().item<double>();
    if (!(error <= 1e-5 * scale)) {
      std::ostringstream why;
      why << dir << ": tensor `classifier.bias` is not zero, and kolos's vit head has no bias; "
          << "it cannot be moved into the final LayerNorm's bias (off by " << error
          << "; this needs classes = " << c.classes << " <= hidden_size = " << h
          << " and a classifier.weight of full rank)";
      throw Error(why.str(), ErrorKind::kCheckpoint);
    }
    for (auto& [name, t] : out.weights) {
      if (name == "head.ln_f.bias") t = folded;
    }
    out.notes.push_back(
        "classifier.bias is not zero and kolos's vit head has no bias: it was moved into "
        "head.ln_f.bias (+ pinv(classifier.weight) x bias: the same logits), and trains as "
        "part of it from here on");
  }
  // ViTModel's pooler, which ViTForImageClassification does not use.
  if (left.has("vit.pooler.dense.weight") || left.has("vit.pooler.dense.bias")) {
    left.drop("vit.pooler.dense.weight");
    left.drop("vit.pooler.dense.bias");
    out.notes.push_back("dropped vit.pooler.dense (ViTForImageClassification does not use it)");
  }
  left.expect_empty("kolos vit", "is this a ViTForImageClassification with num_hidden_layers = " +
                                     std::to_string(c.layers) + " (config.json)?");
  return out;
}

}  // namespace hf_detail
}  // namespace kolos::modules
