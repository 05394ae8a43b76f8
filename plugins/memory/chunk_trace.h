// The chunks plugin's trace: the fixed sequence of steps one iteration
// (optimizer step) is, and the chunks each step needs resident, made once
// at set-up from the chunk layout and which parameters each block reads
// (docs/memory.md). The placement plan (kolos/memory/placement.h) is made
// from it and the executor follows it. Torch-free.
//
//   per block pass of this rank (a micro-batch's forward or backward of a
//     run of blocks, in the pipeline schedule's order): one step per block,
//     its parameters' chunks (and, in a backward step, their gradients');
//   under pipelining, one step holding the tied weights' gradient chunks
//     (copies on several stages, summed by the pipeline after backward);
//   then per chunk index k: the optimizer step of chunk k.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kolos/memory/placement.h"

namespace kolos::chunks {

// The kinds of state, each packed with the same layout: chunk k of every
// kind holds the same parameters. Parameters and gradients are in the run's
// dtype (fp32, bf16 or fp16), the moments in fp32; under bf16/fp16 a fifth
// kind holds the fp32 masters AdamW steps.
enum Kind : size_t { kParam = 0, kGrad = 1, kExpAvg = 2, kExpAvgSq = 3, kMaster = 4, kKinds = 5 };

struct TraceStep {
  // kTied: after the last backward under pipelining, the gradients of tied
  // weights (copies on several stages) resident while the pipeline sums them.
  // kBackwardInput: zero-bubble's input pass (parameters read, gradients
  // untouched); its weight pass is a kBackward.
  enum Type { kForward, kBackward, kBackwardInput, kTied, kOptimizer } type;
  size_t index;  // the block (forward, backward) or the chunk (optimizer)
};

// A pass over blocks [first, last): forward, or backward (from last - 1
// down to first), whole or (input_only) zero-bubble's input part.
struct BlockPass {
  bool backward = false;
  size_t first = 0, last = 0;
  bool input_only = false;
};

// What the trace is made from.
struct TraceInputs {
  size_t chunks = 0;                      // chunk indices, the same in every kind
  size_t kinds = kMaster;                 // kinds in use: 4, or 5 with masters
  std::vector<std::string> names;         // [parameter], for messages
  std::vector<size_t> chunk_of;           // [parameter]: its chunk index
  std::vector<std::vector<size_t>> uses;  // [block]: the parameters it reads, sorted
  std::vector<BlockPass> passes;          // this rank's, in order
  std::vector<size_t> tied;               // tied weights' copies (pipelining)
  std::function<int64_t(size_t kind)> kind_bytes;  // of a chunk of a kind
  // This rank steps chunk index k (ZeRO: its owner; otherwise every rank).
  std::function<bool(size_t k)> owns;
  // This rank keeps k's parameter chunk between uses (not under ZeRO-3
  // on another rank than its owner).
  std::function<bool(size_t k)> keeps_params;
  // ZeRO-3: k's parameter chunk is gathered from its owner where used.
  std::function<bool(size_t k)> gathered;
  // k's gradients are reduced over more than one rank.
  std::function<bool(size_t k)> reduced;
};

class ChunkTrace {
 public:
  ChunkTrace() = default;
  // Throws kolos::Error when a tied weight is read by no block.
  explicit ChunkTrace(TraceInputs inputs);

  // `access` from the block trace with the overlaps a budget of `budget`
  // bytes has room for, step by step:
  // - `reductions`: the gradients a step makes final (of reduced chunks)
  //   are reduced while the next block step runs, their chunks in that
  //   step too (overlap[s]); elsewhere, and after the last block step,
  //   they are waited for at once;
  // - `gathers` (ZeRO-3): the parameter chunks a block step gathers are
  //   gathered while the block step before runs, their chunks in that
  //   step too (ahead[s]); elsewhere when their step begins.
  // The block steps, and so these choices, are the same on every rank that
  // shares the layout.
  void augment(bool reductions, bool gathers, int64_t budget);
  // Set-up is over: the block trace without overlaps goes.
  void drop_block_trace() { block_steps_.clear(); }

  // The executor's chunk of kind `kind`, index k (there is one unless it
  // is an optimizer kind of an index this rank does not own).
  memory::ChunkId id(Kind kind, size_t k) const;
  bool has(Kind kind, size_t k) const { return ids_[kind][k] != kNoChunk; }

  static constexpr size_t kNoStep = static_cast<size_t>(-1);

  memory::AccessTrace access;                          // what the placement plan reads
  std::vector<TraceStep> steps;                        // [step]
  std::vector<Kind> kind_of;                           // [chunk]
  std::vector<size_t> index_of;                        // [chunk]
  size_t tied_step = kNoStep;                          // the tied gradients' step, if any
  size_t optimizer_begin = 0;                          // the first optimizer step
  std::vector<std::vector<memory::ChunkId>> zero_at;   // [step]: gradient chunks first used there
  std::vector<std::vector<size_t>> norm_at;            // [step]: gradients final after it
  std::vector<std::vector<memory::ChunkId>> gather_at; // [step]: ZeRO-3: parameter chunks to gather
  std::vector<bool> overlap;  // [step]: its reductions run during the next step
  std::vector<bool> ahead;    // [step]: its gathers are launched when the step before begins
  std::vector<size_t> tied;   // parameters that are tied weights' copies
  std::vector<bool> is_tied;  // [parameter]
  std::vector<size_t> unused;            // parameters no block reads
  std::vector<bool> norm_everywhere;     // [parameter]: tied or unused (norm taken on every rank)

 private:
  static constexpr memory::ChunkId kNoChunk = static_cast<memory::ChunkId>(-1);
  std::vector<memory::ChunkId> chunks_of(const std::vector<size_t>& params,
                                         std::initializer_list<Kind> kinds) const;

  TraceInputs in_;
  std::vector<std::vector<memory::ChunkId>> ids_;          // [kind][index]
  std::vector<std::vector<memory::ChunkId>> block_steps_;  // access.steps without overlaps
};

}  // namespace kolos::chunks
