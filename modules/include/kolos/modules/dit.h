// DiT (Peebles & Xie 2023): a class-conditional diffusion transformer.
// An image is cut into square patches, each projected by a linear layer,
// with fixed 2D sin-cos (or learned) positions added; the conditioning
// vector c = MLP(sinusoid(t)) + class embedding (one extra "null" class,
// index model.classes, for classifier-free guidance); model.layers DiT
// blocks with adaLN-Zero (c -> shift, scale and gate of the attention and
// of the MLP, the modulation initialised to zero); a final adaLN and a
// linear layer to patch pixels, un-patchified into the predicted noise.
// Written once against LayerFactory, as a list of blocks: "embed",
// "h.0" .. "h.{L-1}", "final". c travels through the blocks as the first
// token of the sequence ([B, 1 + patches, hidden]), so each block is one
// tensor in, one tensor out, and the pipeline can cut between any two.
//
// Training objective (DDPM, noise prediction): for a sample x0 with label
// y, draw t ~ U{0..T-1} and eps ~ N(0, I); x_t = sqrt(abar_t) x0 +
// sqrt(1 - abar_t) eps; the loss is the mean squared error between the
// model's output on (x_t, t, y) and eps, with y replaced by the null class
// with probability model.class_dropout. T = model.diffusion_steps, abar from
// model.beta_schedule ("linear": DDPM's betas 1e-4..0.02 scaled by 1000/T;
// "cosine": Nichol & Dhariwal's).
//
// Input: the engine's int64 sample (kolos/modules/data.h, diffusion
// source): [pixels (image_size^2 * channels float32 bits, H x W x C), label,
// key, key], inputs its first seq_len = pixels + 2 values, targets the
// last seq_len. t, eps and the class dropout are drawn from the key alone
// (a CPU generator seeded with it), so they are the same under every
// layout; the loss draws eps again from the targets' last value.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kolos/core/model.h"

namespace kolos::modules {

std::shared_ptr<Model> build_dit(const ModelConfig& config, LayerFactory& factory);

// abar_t for t = 0..T-1 under the config's schedule.
std::vector<double> dit_alpha_bar(const ModelConfig& config);

// What one sample draws from its key: timestep, whether its label is
// dropped (replaced by the null class), and its noise [pixels] (float32).
struct DitDraw {
  std::vector<int64_t> timesteps;
  std::vector<bool> dropped;
  at::Tensor noise;  // [B, image_size^2 * channels], CPU float32
};
DitDraw dit_draw(const ModelConfig& config, const std::vector<int64_t>& keys);

// The reverse process, serially, on the model's device and dtype.
struct DitSampling {
  int64_t steps = 50;             // timesteps visited (evenly spaced over T)
  std::string sampler = "ddim";   // "ddim" (deterministic) | "ddpm"
  double cfg_scale = 1.0;         // classifier-free guidance; 1: none
  uint64_t seed = 0;              // x_T and DDPM's noise
  double clip_min = -1e30;        // the predicted x0 clamped to [clip_min, clip_max]
  double clip_max = 1e30;
};
// Images [labels.size(), H, W, C] (float32, CPU) in the units the model was
// trained on (the data's normalised pixels). ConfigError for a model that is
// not a dit, a label outside [0, classes), steps outside [1, T], an unknown
// sampler, or guidance on a model trained without class dropout.
at::Tensor dit_sample(Model& model, const ModelConfig& config, const std::vector<int64_t>& labels,
                      const DitSampling& sampling);

}  // namespace kolos::modules
