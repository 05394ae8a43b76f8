// The workload the planner plans for: a GPT-style model's shape and the
// batch, and the arithmetic that depends on the shape alone (parameter
// counts, FLOPs per block). Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kolos::planner {

// GPT as modules/ builds it: learned positions, two LayerNorms per block,
// q/k/v/o and a GELU MLP of width ffn_multiplier * hidden, all with biases,
// the LM head tied to the token embedding. kv_heads < heads shrinks k and
// v (grouped-query attention); 0 means heads.
struct ModelShape {
  std::string name = "gpt";
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, seq_len = 0, vocab = 0;
  int64_t ffn_multiplier = 4;

  int64_t ffn() const { return ffn_multiplier * hidden; }
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  double block_params() const;      // one transformer block
  double embedding_params() const;  // token and position tables
  double head_params() const;       // the final norm (the head reuses the token table)
  double total_params() const;
  // Throws ConfigError naming the first field that is not positive, or
  // heads that do not divide hidden.
  void validate() const;
};

// What is trained per step: the global batch in sequences, and the precision
// of parameters, gradients and activations ("bf16", "fp16" or "fp32"; the
// optimizer keeps fp32 AdamW moments and, below fp32, fp32 masters).
struct Workload {
  ModelShape model;
  int64_t global_batch = 0;
  std::string precision = "bf16";
  // What the run sets beyond the plan, as the memory estimate reads it
  // (kolos/core/plugin_terms.h): the gradient bucket ([parallel]
  // bucket_mb), every how many blocks recomputation acts, whether the run
  // has the memory role ([memory]), and the plugins' keys by full name
  // (a candidate's own pipeline schedule replaces the run's).
  double bucket_bytes = 25.0 * 1024 * 1024;
  int64_t recompute_every = 1;
  bool memory_role = false;
  // Whether training runs on kolos's tuned heap (kolos/core/malloc_tuning.h;
  // KOLOS_MALLOC=tuned; the caller sets it from training_malloc() once, not
  // per candidate).
  bool heap_tuned = false;
  std::map<std::string, std::string> settings;
  double element_bytes() const { return precision == "fp32" ? 4.0 : 2.0; }
};

// FLOPs of one micro-batch of b sequences through one block, forward only,
// without any parallel split: the matrix products (q, k, v, o: 2bs·h·(2h +
// 2·kv·h/heads); the MLP: 4bs·h·ffn), and the attention core (QK^T and the
// weighted sum of V: 4·b·s²·h). With ffn = 4h and kv = heads this is the
// standard 24·b·s·h² + 4·b·s²·h.
struct BlockFlops {
  double gemm = 0;       // matrix products of the projections and the MLP
  double attention = 0;  // the s x s core
  double total() const { return gemm + attention; }
};
BlockFlops block_forward_flops(const ModelShape& m, double b);
// The logit layer, forward: 2·b·s·h·vocab.
double logit_forward_flops(const ModelShape& m, double b);
// Bytes an unfused implementation moves through memory in one block's
// forward, beyond the matrix products: norms, residual adds, GELU, bias adds,
// and the softmax over b·heads·s² scores (read and written twice: scale and
// mask, softmax). An assumed count of passes, written out in model.cpp.
double block_forward_elementwise_bytes(const ModelShape& m, double b, double element_bytes);

// Forward + backward FLOPs of one step of `batch` sequences, as Narayanan et
// al. (2021, eq. 3) count them with full recomputation (four forward passes
// of the blocks, three of the logit layer): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)). The published
// per-GPU throughputs use this count; the comparison table uses it too.
double megatron_step_flops(const ModelShape& m, double batch);

}  // namespace kolos::planner
