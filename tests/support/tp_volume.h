// The analytic communication volume of tensor parallelism: bytes one rank
// sends per optimizer step for the GPT of modules/ under each tp mode,
// written from the algorithms (plugins/tp/tp1d.cpp, tp_grid.h), not from a
// run, in the terms in which the traffic test observes MPI calls
// (observed_traffic.h: bytes sent under the bandwidth-optimal algorithm of
// each call):
//   all_reduce over n of X bytes:   2 (n-1) X / n
//   all_gather over n, x per rank:  (n-1) x
//   reduce_scatter over n, X in:    (n-1) X / n
// A gather's backward is a reduce-scatter of the same volume, and the
// reverse, so a differentiable gather or scatter costs twice its forward.
// Shared by the traffic test and the tensor-parallel benchmark.
#pragma once

#include <cstdint>
#include <string>

#include "kolos/core/run_config.h"

namespace kolos::testing {

struct TpShape {
  std::string mode;  // "1d" | "2d" | "2.5d" | "3d"
  int64_t size = 1, depth = 1;
  int64_t batch = 0, seq = 0, hidden = 0, inner = 0, vocab = 0, layers = 0;
  int64_t micro_batches = 1;  // per optimizer step
  int64_t elem = 4;           // bytes per element (fp32)
};

// The shape of `config`'s GPT and tensor parallelism, with `micro_batches`
// micro-batches per step (Engine::accumulation()).
inline TpShape tp_shape(const RunConfig& config, int64_t micro_batches) {
  TpShape shape;
  shape.mode = config.parallel.tensor.size > 1 ? config.parallel.tensor.mode : "1d";
  shape.size = config.parallel.tensor.size;
  shape.depth = 1;  // tp2p5d's key
  if (shape.mode == "2.5d") config.section("parallel.tensor").read("depth", shape.depth);
  shape.batch = config.train.micro_batch;
  shape.seq = config.model.seq_len;
  shape.hidden = config.model.hidden;
  shape.inner = config.model.hidden * config.model.mlp_ratio;
  shape.vocab = config.model.vocab;
  shape.layers = config.model.layers;
  shape.micro_batches = micro_batches;
  return shape;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t tp_bytes_per_step(const TpShape& t) {
  const int64_t E = t.elem, b = t.batch, s = t.seq, h = t.hidden, f = t.inner, V = t.vocab;
  auto ar = [](int64_t numel, int64_t n, int64_t elem) { return 2 * (n - 1) * numel * elem / n; };
  int64_t per_micro = 0;
  if (t.mode == "1d") {
    const int64_t n = t.size;
    // Embedding (wte) forward all-reduce; per layer: attention's shared
    // input (backward) and output (forward), the MLP's likewise; the LM
    // head's input (backward). The position embedding: forward. The loss:
    // row max, sum of exponentials, target logit.
    per_micro = (4 * t.layers + 2) * ar(b * s * h, n, E) + ar(s * h, n, E) + 3 * ar(b * s, n, E);
  } else {
    int64_t q = 1;
    while ((t.mode == "2d" ? q * q : t.mode == "2.5d" ? q * q * t.depth : q * q * q) < t.size) ++q;
    const int64_t nb = t.mode == "2d" ? q : t.mode == "2.5d" ? q * t.depth : q * q;  // batch split
    const bool three = t.mode == "3d";
    auto gather2 = [&](int64_t local, int64_t n) { return 2 * (n - 1) * local * E; };
    auto scatter2 = [&](int64_t input, int64_t n) { return 2 * (n - 1) * input * E / n; };
    const int64_t rows = b / nb * s;  // activation rows held, layout A
    auto linear = [&](int64_t in, int64_t out, bool input_ready) {
      int64_t bytes = 0;
      if (!three) {
        if (!input_ready) bytes += gather2(rows * in / q, q);  // X's row over F
        bytes += gather2(ceil_div(out / q, nb) * in, nb);      // W's column over B
        bytes += gather2(ceil_div(out / q, nb), nb);           // bias over B
      } else {
        if (!input_ready) bytes += gather2(b / (q * q) * s * in / q, q);  // X over j, batch
        bytes += gather2(ceil_div(out / q, q) * in / q, q);               // W over i
        bytes += scatter2(b / q * s * out / q, q);                        // Y over l, batch
        bytes += gather2(ceil_div(out / q, q * q), q * q);                // bias over (i, l)
      }
      return bytes;
    };
    auto norm = [&](int64_t dim) {
      // mean and variance: all-reduced forward and backward; gamma, beta.
      return 4 * ar(rows, q, E) + 2 * gather2(ceil_div(dim / q, nb), nb);
    };
    int64_t column_input = !three ? gather2(rows * h / q, q) : gather2(b / (q * q) * s * h / q, q);
    int64_t block = norm(h) + column_input + 3 * linear(h, h, true) + linear(h, h, false) +
                    norm(h) + linear(h, f, false) + linear(f, h, false);
    int64_t embed = scatter2(b * s * h / q, nb) + 2 * ar(s * h / q, nb, E);
    int64_t head = norm(h) + gather2(rows * h / q, nb) + scatter2(b * s * (V / nb), q) +
                   3 * ar(b / q * s, nb, E) + ar(1, q, E);  // loss; its mean over F
    per_micro = embed + t.layers * block + head;
  }
  // The global gradient norm: one double all-reduced over the tp group.
  return t.micro_batches * per_micro + 2 * (t.size - 1) * 8 / t.size;
}

}  // namespace kolos::testing
