// The inference engine: a model from the zoo, built through the layers
// role's factory on an inference mesh (serial, or tp1d over every rank),
// its weights read from a kolos checkpoint of any layout (each rank reads
// the hyperslabs its placements name: resharding) or from a Hugging Face
// directory (through the importer), a paged KV cache on every rank, and the
// scheduler on rank 0.
//
// A step, collective over the world:
//   rank 0   schedule() -> the step's batch, packed into one int64 buffer of
//            a fixed size every rank knows -> broadcast
//   all      unpack; run the model's blocks over the batch's tokens with the
//            paged cache attached (kolos/core/attention_cache.h); the head
//            only over each sampled chunk's last token; under tp1d the
//            vocabulary slices of those logits are gathered
//   rank 0   sample each row with its request's sampler, complete() the step
// Rank 0 ends the loop with a stop command in the same buffer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/run_config.h"
#include "kolos/inference/config.h"
#include "kolos/inference/scheduler.h"

namespace kolos::inference {

class InferenceEngine {
 public:
  // Collective over `world`. `path`: a kolos checkpoint (a step directory or
  // a root whose `latest` names one) or a Hugging Face model directory
  // (config.json and safetensors). Errors every rank can find alone (an
  // unreadable path, a model the inference mesh cannot split, a pool too
  // small for one context) are agreed: every rank throws the same
  // AgreedError.
  // `plugin_path`: searched for the layers plugin before KOLOS_PLUGIN_PATH
  // ([plugins] path of the command's config).
  InferenceEngine(const std::string& path, const InferenceConfig& config,
                  comm::ProcessGroupPtr world, std::vector<std::string> plugin_path = {});
  ~InferenceEngine();
  InferenceEngine(const InferenceEngine&) = delete;
  InferenceEngine& operator=(const InferenceEngine&) = delete;

  bool is_driver() const;  // rank 0: owns the scheduler
  // Rank 0 only.
  Scheduler& scheduler();

  // Rank 0: steps until every request has finished, calling `on_event` for
  // each token as it is sampled; then releases the other ranks (stop()).
  void run(const std::function<void(const TokenEvent&)>& on_event);
  // Rank 0: one step (collective: the others must be in follow()).
  std::vector<TokenEvent> step();
  // Rank 0: ends the other ranks' follow().
  void stop();
  // Rank 0: a step without work, so that the other ranks, waiting in
  // follow(), are not left in one broadcast longer than the communication
  // timeout while rank 0 has nothing to do (a server between requests).
  void idle();
  // Every rank but 0: runs the steps rank 0 broadcasts until it stops.
  void follow();

  // Rank 0: where step() has spent its time since the engine was made
  // (kolos generate prints it in its summary).
  struct StepTimes {
    int64_t steps = 0;
    int64_t decode_steps = 0;     // steps that fed every sequence one token (decoding)
    double forward_s = 0;         // the model's forward, rank 0 waiting for the other ranks'
    double decode_forward_s = 0;  // the part of forward_s in decode_steps
    double sample_s = 0;          // choosing each sequence's token from its logits
  };
  const StepTimes& step_times() const;

  const ModelConfig& model() const;
  int64_t num_blocks() const;
  std::string describe() const;  // one line: model, source, mesh, precision, pool

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolos::inference
