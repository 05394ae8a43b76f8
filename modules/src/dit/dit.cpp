#include "kolos/modules/dit.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "common/model_checks.h"
#include "kolos/core/error.h"

namespace kolos::modules {
namespace {

constexpr int64_t kTimeFrequencies = 256;  // width of the sinusoidal timestep features
constexpr double kNormEps = 1e-6;          // the blocks' affine-free LayerNorms

int64_t pixels_of(const ModelConfig& c) { return c.image_size * c.image_size * c.channels; }

// [B] timesteps (float) -> [B, kTimeFrequencies]: cos and sin of t at
// geometrically spaced frequencies from 1 down to 1/10000.
at::Tensor timestep_features(const at::Tensor& t) {
  const int64_t half = kTimeFrequencies / 2;
  const at::Tensor freqs =
      torch::exp(-std::log(10000.0) / static_cast<double>(half) *
                 torch::arange(half, torch::TensorOptions().dtype(at::kFloat).device(t.device())));
  const at::Tensor angles = t.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(angles), torch::sin(angles)}, 1);
}

// [positions] -> [positions, dim]: sin and cos pairs at geometrically spaced
// frequencies (an odd last feature is zero).
at::Tensor sincos_1d(const at::Tensor& positions, int64_t dim) {
  const int64_t half = dim / 2;
  at::Tensor out = torch::zeros({positions.size(0), dim});
  if (half == 0) return out;
  const at::Tensor freqs = torch::pow(
      10000.0, -torch::arange(half, at::kDouble) / static_cast<double>(half));
  const at::Tensor angles = positions.to(at::kDouble).unsqueeze(1) * freqs.unsqueeze(0);
  out.narrow(1, 0, half).copy_(torch::sin(angles));
  out.narrow(1, half, half).copy_(torch::cos(angles));
  return out;
}

// Fixed 2D positions of a side x side grid of patches, row-major: the first
// half of the features encode the row, the rest the column.
at::Tensor sincos_2d(int64_t side, int64_t hidden) {
  const at::Tensor index = torch::arange(side * side, at::kLong);
  const int64_t rows = hidden / 2;
  return torch::cat({sincos_1d(index.div(side, "floor"), rows),
                     sincos_1d(index.remainder(side), hidden - rows)},
                    1);
}

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

// c [B(local), hidden(local)] -> n modulation vectors, each [B(local),
// hidden(local)]: the adaLN layer runs on the whole c (a replicated linear
// layer), and each rank keeps its block of what it outputs.
std::vector<at::Tensor> modulations(LayerFactory& factory, Layer& adaln, const at::Tensor& c,
                                    int64_t n) {
  const at::Tensor whole = factory.to_whole(c);
  const at::Tensor m = adaln.forward(torch::silu(whole)).view({whole.size(0), n, -1});
  return factory.to_local(m).unbind(1);
}

// adaLN-Zero: the modulation layers start at zero, so every block starts as
// the identity and the final layer outputs zeros.
void zero_parameters(Layer& layer) {
  torch::NoGradGuard no_grad;
  for (auto& p : layer.parameters()) p.zero_();
}

// The pixels of x_t, the timestep and the label -> [B, 1 + patches, hidden]:
// the conditioning vector c first, then the embedded patches. Training
// (forward) draws t, the noise and the class dropout from each sample's
// key; sampling calls tokens() with its own x_t and t.
class DitEmbedding : public Layer {
 public:
  DitEmbedding(LayerFactory& factory, const ModelConfig& c)
      : factory_(&factory), config_(c), alpha_bar_(dit_alpha_bar(c)) {
    const int64_t patch_dim = c.patch_size * c.patch_size * c.channels;
    side_ = c.image_size / c.patch_size;
    proj_ = register_module(
        "patch_proj",
        factory.linear(LinearSpec{patch_dim, c.hidden, true, LinearRole::kReplicated, c.init_std}));
    time_1_ = register_module(
        "time_fc1", factory.linear(LinearSpec{kTimeFrequencies, c.hidden, true,
                                              LinearRole::kReplicated, c.init_std}));
    time_2_ = register_module(
        "time_fc2",
        factory.linear(LinearSpec{c.hidden, c.hidden, true, LinearRole::kReplicated, c.init_std}));
    // The class table: classes + 1 rows, the last the null class. (A plain
    // parameter, whole on every rank, as ViT's positions; ZeRO-3 shards its
    // dimension 0.)
    classes_ =
        register_parameter("class_embed", torch::randn({c.classes + 1, c.hidden}) * c.init_std);
    if (c.pos_embed == "learned") {
      pos_ = register_parameter("pos_embed", torch::randn({side_ * side_, c.hidden}) * c.init_std);
    }
  }

  at::Tensor forward(const at::Tensor& samples) override {
    const int64_t batch = samples.size(0);
    const int64_t pixels = pixels_of(config_);
    KOLOS_CHECK_EQ(samples.size(1), pixels + 2,
                   "dit: values per sample (image_size^2 * channels + 2)");
    const at::Tensor x0 = samples.narrow(1, 0, pixels).to(at::kInt).view(at::kFloat);
    const at::Tensor keys_cpu = samples.select(1, pixels + 1).to(at::kCPU).contiguous();
    const std::vector<int64_t> keys(keys_cpu.data_ptr<int64_t>(),
                                    keys_cpu.data_ptr<int64_t>() + batch);
    const DitDraw draw = dit_draw(config_, keys);
    std::vector<float> a(batch), s(batch), t(batch);
    std::vector<int64_t> drop(batch);
    for (int64_t i = 0; i < batch; ++i) {
      const double abar = alpha_bar_[static_cast<size_t>(draw.timesteps[i])];
      a[i] = static_cast<float>(std::sqrt(abar));
      s[i] = static_cast<float>(std::sqrt(1.0 - abar));
      t[i] = static_cast<float>(draw.timesteps[i]);
      drop[i] = draw.dropped[i] ? 1 : 0;
    }
    const auto on = [&](const at::Tensor& v) { return v.to(samples.device()); };
    const at::Tensor xt = on(torch::tensor(a).unsqueeze(1)) * x0 +
                          on(torch::tensor(s).unsqueeze(1)) * on(draw.noise);
    at::Tensor labels = samples.select(1, pixels);
    labels = torch::where(on(torch::tensor(drop).to(at::kBool)),
                          torch::full_like(labels, config_.classes), labels);
    return tokens(xt, on(torch::tensor(t)), labels);
  }

  // x [B, pixels] (float), t [B] (float), labels [B] (int64, classes = null).
  at::Tensor tokens(const at::Tensor& x, const at::Tensor& t, const at::Tensor& labels) {
    const int64_t batch = x.size(0);
    const int64_t p = config_.patch_size, ch = config_.channels;
    const at::ScalarType dtype = classes_.scalar_type();
    const at::Tensor patches = x.reshape({batch, side_, p, side_, p, ch})
                                   .permute({0, 1, 3, 2, 4, 5})
                                   .reshape({batch, side_ * side_, p * p * ch})
                                   .to(dtype);
    const at::Tensor pos =
        pos_.defined() ? pos_ : sincos_2d(side_, config_.hidden).to(classes_.options());
    const at::Tensor h = proj_->forward(patches) + pos.unsqueeze(0);
    const at::Tensor time =
        time_2_->forward(torch::silu(time_1_->forward(timestep_features(t).to(dtype))));
    const at::Tensor c = time + classes_.index_select(0, labels);
    // Whole on every tensor-parallel rank so far: the blocks take this
    // rank's block of it.
    return factory_->to_local(torch::cat({c.unsqueeze(1), h}, 1));
  }

 private:
  LayerFactory* factory_;
  ModelConfig config_;
  std::vector<double> alpha_bar_;
  int64_t side_ = 0;
  LayerPtr proj_, time_1_, time_2_;
  at::Tensor classes_, pos_;
};

// A DiT block with adaLN-Zero: c -> (shift, scale, gate) for the attention
// and for the MLP; the LayerNorms have no parameters of their own.
class DitBlock : public Layer {
 public:
  DitBlock(LayerFactory& factory, const ModelConfig& c) : factory_(&factory) {
    const double out_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
    AttentionSpec attention{c.hidden, c.heads, c.init_std, out_std};
    attention.causal = false;
    modulation_ = register_module(
        "adaln", factory.linear(LinearSpec{c.hidden, 6 * c.hidden, true, LinearRole::kReplicated,
                                           c.init_std}));
    zero_parameters(*modulation_);
    attn_ = register_module("attn", factory.attention(attention));
    mlp_ = register_module(
        "mlp", factory.mlp(MlpSpec{c.hidden, c.mlp_ratio * c.hidden, c.init_std, out_std}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor c = x.select(1, 0);
    at::Tensor h = x.narrow(1, 1, x.size(1) - 1);
    const std::vector<at::Tensor> m = modulations(*factory_, *modulation_, c, 6);
    const auto norm = [this](const at::Tensor& v) { return factory_->normalize(v, kNormEps); };
    h = h + m[2].unsqueeze(1) * attn_->forward(modulate(norm(h), m[0], m[1]));
    h = h + m[5].unsqueeze(1) * mlp_->forward(modulate(norm(h), m[3], m[4]));
    return torch::cat({c.unsqueeze(1), h}, 1);
  }

 private:
  LayerFactory* factory_;
  LayerPtr modulation_, attn_, mlp_;
};

// adaLN, then a linear layer to each patch's pixels, un-patchified:
// [B, 1 + patches, hidden] -> [B, H, W, C], the predicted noise.
class DitFinal : public Layer {
 public:
  DitFinal(LayerFactory& factory, const ModelConfig& c)
      : factory_(&factory), image_(c.image_size), patch_(c.patch_size), channels_(c.channels) {
    modulation_ = register_module(
        "adaln", factory.linear(LinearSpec{c.hidden, 2 * c.hidden, true, LinearRole::kReplicated,
                                           c.init_std}));
    zero_parameters(*modulation_);
    out_ = register_module(
        "out", factory.linear(LinearSpec{c.hidden, patch_ * patch_ * channels_, true,
                                         LinearRole::kReplicated, c.init_std}));
    zero_parameters(*out_);
  }
  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor c = x.select(1, 0);
    const at::Tensor h = x.narrow(1, 1, x.size(1) - 1);
    const std::vector<at::Tensor> m = modulations(*factory_, *modulation_, c, 2);
    // The output layer is replicated: it runs on the whole hidden state.
    const at::Tensor out = out_->forward(
        factory_->to_whole(modulate(factory_->normalize(h, kNormEps), m[0], m[1])));
    const int64_t side = image_ / patch_;
    const int64_t batch = out.size(0);
    return out.reshape({batch, side, side, patch_, patch_, channels_})
        .permute({0, 1, 3, 2, 4, 5})
        .reshape({batch, image_, image_, channels_});
  }

 private:
  LayerFactory* factory_;
  int64_t image_, patch_, channels_;
  LayerPtr modulation_, out_;
};

}  // namespace

std::vector<double> dit_alpha_bar(const ModelConfig& c) {
  const int64_t steps = c.diffusion_steps;
  std::vector<double> out(static_cast<size_t>(steps));
  if (c.beta_schedule == "cosine") {
    // abar(t) = f(t) / f(0), f(t) = cos^2((t/T + s) / (1 + s) * pi/2),
    // each beta capped at 0.999.
    const double s = 0.008;
    const auto f = [&](double t) {
      const double v = std::cos((t / static_cast<double>(steps) + s) / (1 + s) * M_PI / 2);
      return v * v;
    };
    double abar = 1.0;
    for (int64_t t = 0; t < steps; ++t) {
      const double beta = std::min(0.999, 1.0 - f(t + 1.0) / f(static_cast<double>(t)));
      abar *= 1.0 - beta;
      out[static_cast<size_t>(t)] = abar;
    }
    return out;
  }
  // Linear betas from 1e-4 to 0.02 at T = 1000, scaled by 1000 / T.
  const double scale = 1000.0 / static_cast<double>(steps);
  const double first = scale * 1e-4, last = std::min(0.999, scale * 0.02);
  double abar = 1.0;
  for (int64_t t = 0; t < steps; ++t) {
    const double beta =
        steps == 1 ? first : first + (last - first) * static_cast<double>(t) / (steps - 1.0);
    abar *= 1.0 - beta;
    out[static_cast<size_t>(t)] = abar;
  }
  return out;
}

DitDraw dit_draw(const ModelConfig& c, const std::vector<int64_t>& keys) {
  DitDraw draw;
  const int64_t batch = static_cast<int64_t>(keys.size());
  draw.noise = torch::empty({batch, pixels_of(c)}, at::kFloat);
  for (int64_t i = 0; i < batch; ++i) {
    // One generator per sample, seeded with its key: the draws do not depend
    // on which other samples share its micro-batch or rank.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(keys[i]));
    const at::Tensor u = torch::rand({2}, gen, torch::TensorOptions().dtype(at::kDouble));
    const int64_t t = std::min<int64_t>(
        c.diffusion_steps - 1,
        static_cast<int64_t>(u[0].item<double>() * static_cast<double>(c.diffusion_steps)));
    draw.timesteps.push_back(t);
    draw.dropped.push_back(u[1].item<double>() < c.class_dropout);
    draw.noise[i].copy_(torch::randn({pixels_of(c)}, gen, torch::TensorOptions().dtype(at::kFloat)));
  }
  return draw;
}

std::shared_ptr<Model> build_dit(const ModelConfig& c, LayerFactory& factory) {
  check_image_model(c, "dit");
  KOLOS_CHECK_KIND(kConfig, c.diffusion_steps >= 2, "model.diffusion_steps = ", c.diffusion_steps,
                   ": at least 2");
  auto model = std::make_shared<Model>();
  model->add_block("embed", std::make_shared<DitEmbedding>(factory, c));
  for (int64_t i = 0; i < c.layers; ++i) {
    model->add_block("h." + std::to_string(i), std::make_shared<DitBlock>(factory, c),
                     /*repeated=*/true);
  }
  model->add_block("final", std::make_shared<DitFinal>(factory, c));
  // The noise of each sample again, from the key that ends its targets.
  model->set_loss([c](const at::Tensor& predicted, const at::Tensor& targets) {
    const int64_t batch = targets.size(0);
    const at::Tensor keys_cpu = targets.select(1, targets.size(1) - 1).to(at::kCPU).contiguous();
    const std::vector<int64_t> keys(keys_cpu.data_ptr<int64_t>(),
                                    keys_cpu.data_ptr<int64_t>() + batch);
    const at::Tensor noise = dit_draw(c, keys).noise.to(predicted.device());
    return torch::mse_loss(predicted.to(at::kFloat).reshape({batch, -1}), noise);
  });
  return model;
}

at::Tensor dit_sample(Model& model, const ModelConfig& c, const std::vector<int64_t>& labels,
                      const DitSampling& s) {
  KOLOS_CHECK_KIND(kConfig, c.name == "dit", "model.name = \"", c.name,
                   "\" is not a diffusion model; sampling needs model.name = \"dit\"");
  auto* embed = model.blocks().empty()
                    ? nullptr
                    : dynamic_cast<DitEmbedding*>(model.blocks().front().second.get());
  KOLOS_CHECK_KIND(kConfig, embed != nullptr, "the model's first block is not a DiT embedding");
  for (const int64_t y : labels) {
    KOLOS_CHECK_KIND(kConfig, y >= 0 && y < c.classes, "class ", y,
                     " is outside the model's classes 0..", c.classes - 1, " (model.classes = ",
                     c.classes, ")");
  }
  KOLOS_CHECK_KIND(kConfig, s.steps >= 1 && s.steps <= c.diffusion_steps, "steps = ", s.steps,
                   ": expected 1..", c.diffusion_steps, " (model.diffusion_steps)");
  KOLOS_CHECK_KIND(kConfig, s.sampler == "ddim" || s.sampler == "ddpm", "sampler `", s.sampler,
                   "`: expected ddim or ddpm");
  KOLOS_CHECK_KIND(kConfig, std::isfinite(s.cfg_scale) && s.cfg_scale >= 0, "cfg scale ",
                   s.cfg_scale, ": expected a finite number >= 0");
  const bool guided = s.cfg_scale != 1.0;
  KOLOS_CHECK_KIND(kConfig, !guided || c.class_dropout > 0, "cfg scale ", s.cfg_scale,
                   ": the model was trained with model.class_dropout = 0, so it never saw the "
                   "null class and has no unconditional prediction; use a cfg scale of 1");
  torch::NoGradGuard no_grad;
  const std::vector<double> abar = dit_alpha_bar(c);
  const int64_t n = static_cast<int64_t>(labels.size());
  const int64_t pixels = pixels_of(c);
  const at::Device device = model.parameters().front().device();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(s.seed);
  const auto normal = [&] { return torch::randn({n, pixels}, gen, at::kFloat).to(device); };
  // Visited timesteps: T-1 down to 0, evenly spaced.
  std::vector<int64_t> times(static_cast<size_t>(s.steps));
  for (int64_t i = 0; i < s.steps; ++i) {
    times[static_cast<size_t>(i)] =
        s.steps == 1 ? c.diffusion_steps - 1
                     : std::llround(static_cast<double>(i) * (c.diffusion_steps - 1) /
                                    static_cast<double>(s.steps - 1));
  }
  const at::Tensor y = torch::tensor(labels, at::kLong).to(device);
  const at::Tensor y_in = guided ? torch::cat({y, torch::full_like(y, c.classes)}) : y;
  at::Tensor x = normal();
  for (int64_t i = s.steps - 1; i >= 0; --i) {
    const int64_t t = times[static_cast<size_t>(i)];
    const double a_t = abar[static_cast<size_t>(t)];
    const double a_prev = i > 0 ? abar[static_cast<size_t>(times[static_cast<size_t>(i - 1)])] : 1.0;
    const at::Tensor x_in = guided ? torch::cat({x, x}) : x;
    const at::Tensor t_in = torch::full({x_in.size(0)}, static_cast<float>(t),
                                        torch::TensorOptions().dtype(at::kFloat).device(device));
    at::Tensor eps = model.forward(embed->tokens(x_in, t_in, y_in), 1).to(at::kFloat)
                         .reshape({x_in.size(0), pixels});
    if (guided) {
      const at::Tensor cond = eps.narrow(0, 0, n), uncond = eps.narrow(0, n, n);
      eps = uncond + s.cfg_scale * (cond - uncond);
    }
    const at::Tensor x0 =
        ((x - std::sqrt(1 - a_t) * eps) / std::sqrt(a_t)).clamp(s.clip_min, s.clip_max);
    if (s.sampler == "ddim") {
      const at::Tensor e = (x - std::sqrt(a_t) * x0) / std::sqrt(1 - a_t);
      x = std::sqrt(a_prev) * x0 + std::sqrt(1 - a_prev) * e;
    } else {
      // The posterior q(x_prev | x_t, x0) of the (respaced) chain.
      const double beta = 1 - a_t / a_prev;
      const at::Tensor mean = (std::sqrt(a_prev) * beta / (1 - a_t)) * x0 +
                              (std::sqrt(1 - beta) * (1 - a_prev) / (1 - a_t)) * x;
      x = mean;
      if (i > 0) x = x + std::sqrt(beta * (1 - a_prev) / (1 - a_t)) * normal();
    }
  }
  return x.reshape({n, c.image_size, c.image_size, c.channels}).to(at::kCPU);
}

}  // namespace kolos::modules
