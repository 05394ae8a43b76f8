#include "kolos/inference/engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/experts.h"
#include "kolos/core/format.h"
#include "kolos/core/mesh.h"
#include "kolos/core/model.h"
#include "kolos/core/packed_linear.h"
#include "kolos/core/precision.h"
#include "kolos/core/runtime.h"
#include "kolos/core/training_state.h"
#include "kolos/inference/kv_cache.h"
#include "kolos/modules/gpt.h"
#include "kolos/modules/hf.h"

namespace kolos::inference {
namespace {

enum Command : int64_t { kStop = 0, kStep = 1, kIdle = 2 };

// Where the weights come from, read on every rank before any communication.
struct Source {
  std::string kind;  // "checkpoint" | "hf"
  std::string dir;   // the checkpoint directory, or the Hugging Face directory
  ModelConfig model;
  modules::NamedTensors weights;  // hf: global fp32 weights by kolos name
};

Source open_source(const std::string& path) {
  namespace fs = std::filesystem;
  Source source;
  if (fs::is_regular_file(fs::path(path) / "config.json")) {
    std::ifstream file(path + "/config.json");
    if (!file) throw Error(path + "/config.json: cannot be read", ErrorKind::kCheckpoint);
    const std::string json((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
    modules::ImportedModel imported =
        modules::from_hf(json, checkpoint::read_safetensors_dir(path), path);
    source.kind = "hf";
    source.dir = path;
    source.model = imported.model;
    source.weights = std::move(imported.weights);
    return source;
  }
  if (!fs::exists(path)) {
    throw Error(path + ": no such checkpoint or Hugging Face directory", ErrorKind::kCheckpoint);
  }
  source.kind = "checkpoint";
  source.dir = checkpoint::resolve(path);
  const checkpoint::Inspection inspection = checkpoint::inspect(source.dir);
  if (inspection.meta.config_toml.empty()) {
    throw Error(source.dir + "/index.h5: records no configuration, so its model is unknown",
                ErrorKind::kCheckpoint);
  }
  source.model =
      parse_run_config(inspection.meta.config_toml, source.dir + "/index.h5 (config)").model;
  return source;
}

// The run an inference mesh of `ranks` ranks is: the checkpoint's model,
// `stages` pipeline stages of tensor-parallel (tp1d) groups, nothing else.
// (The pipeline plugin is only checked, with one micro-batch per stage; the
// engine runs the stages itself.)
RunConfig inference_run(const ModelConfig& model, int64_t ranks, int64_t stages,
                        std::vector<std::string> plugin_path) {
  RunConfig config;
  config.source = "<inference>";
  config.model = model;
  // A mixture of experts is served dropless, whatever capacity it trained
  // with: a token's output must not depend on the other requests of its
  // step. Its auxiliary losses train the router only.
  config.model.capacity_factor = 0;
  config.model.aux_loss_coef = 0;
  config.model.z_loss_coef = 0;
  config.parallel.tensor.size = ranks / stages;
  config.parallel.tensor.mode = "1d";
  config.parallel.pipeline.size = stages;
  config.train.micro_batch = 1;
  config.train.global_batch = stages;
  config.plugins.path = std::move(plugin_path);
  return config;
}

// Stage of each block: the embedding on the first stage, the head on the
// last, the transformer blocks in contiguous runs as even as they divide.
std::vector<int> stage_of_blocks(size_t blocks, int64_t stages) {
  const int64_t layers = static_cast<int64_t>(blocks) - 2;
  std::vector<int> out(blocks, 0);
  for (int64_t i = 0; i < layers; ++i) {
    out[static_cast<size_t>(i + 1)] = static_cast<int>(i * stages / layers);
  }
  out.back() = static_cast<int>(stages - 1);
  return out;
}

}  // namespace

struct InferenceEngine::Impl {
  InferenceConfig config;
  comm::ProcessGroupPtr world;
  Source source;
  RunConfig run;
  std::unique_ptr<DeviceMesh> mesh;
  std::shared_ptr<LayerFactory> factory;
  std::shared_ptr<Model> model;
  std::unique_ptr<PagedKvCache> cache;
  std::unique_ptr<Scheduler> scheduler;
  at::ScalarType dtype = at::kFloat;
  int64_t num_blocks = 0, max_blocks = 0, capacity = 0;
  int64_t packed_layers = 0;  // linear layers inference.pack_weights packed
  InferenceEngine::StepTimes times;
  at::Tensor buffer;          // the step broadcast, int64 [capacity]

  void setup(const std::string& path, std::vector<std::string> plugin_path);
  void load_weights();
  void pack(int64_t command, const StepPlan& plan);
  StepBatch unpack() const;
  // Runs the batch; the logits ([rows, vocab], fp32) of each sampled
  // chunk's last token (only rank 0's are whole under tp; others: as gathered).
  at::Tensor forward(const StepBatch& batch);
};

void InferenceEngine::Impl::setup(const std::string& path, std::vector<std::string> plugin_path) {
  const int64_t ranks = world->size();
  MeshShape shape;
  std::string error;
  int kind = 0;
  try {
    modules::register_builtin_models();
    source = open_source(path);
    // The engine generates text: a causal language model with a KV cache.
    const std::string& name = source.model.name;
    if (name != "gpt" && name != "llama" && name != "mixtral") {
      throw ConfigError(path + ": model.name = \"" + name +
                        "\" is not a language model; kolos generate and kolos serve run "
                        "\"gpt\", \"llama\" and \"mixtral\" models (a \"vit\" classifier is "
                        "evaluated by [eval] in kolos train; a \"dit\" model draws images with "
                        "kolos sample)");
    }
    if (name == "mixtral" && source.model.capacity_factor > 0 && world->rank() == 0) {
      std::fprintf(stderr,
                   "kolos: note: model.capacity_factor = %g: served dropless (every token "
                   "reaches its top_k experts), so that a request's output does not depend on "
                   "the others in its step\n",
                   source.model.capacity_factor);
    }
    const int64_t stages = config.pipeline_stages;
    if (ranks % stages != 0 || stages > source.model.layers) {
      throw ConfigError("inference.pipeline_stages = " + std::to_string(stages) +
                        ": the stages must divide the " + std::to_string(ranks) +
                        " ranks and be at most the model's " + std::to_string(source.model.layers) +
                        " layers (model.layers)");
    }
    run = inference_run(source.model, ranks, stages, std::move(plugin_path));
    check_model_name(run.model);
    RunPlan plan = plan_run(run, ranks);
    shape = plan.shape;
    factory = std::move(plan.layers);
    dtype = config.precision == "bf16" ? at::kBFloat16 : at::kFloat;
    const ModelConfig& m = run.model;
    const int64_t tp = ranks / stages;
    const int64_t kv_heads = (m.name != "gpt" && m.kv_heads > 0 ? m.kv_heads : m.heads) / tp;
    // The stage's attention layers (every rank computes every stage's split).
    const int64_t stage = world->rank() / tp;
    const std::vector<int> split = stage_of_blocks(static_cast<size_t>(m.layers + 2), stages);
    int64_t local_layers = 0;
    for (int64_t i = 0; i < m.layers; ++i)
      local_layers += split[static_cast<size_t>(i + 1)] == stage;
    const int64_t head_dim = m.hidden / m.heads;
    const int64_t block =
        PagedKvCache::block_bytes(local_layers, config.block_size, kv_heads, head_dim, dtype);
    num_blocks = config.kv_cache_memory / block;
    max_blocks = blocks_for(m.seq_len, config.block_size);
    if (num_blocks < max_blocks) {
      throw ConfigError(
          "inference.kv_cache_memory = " + detail::format_bytes(double(config.kv_cache_memory)) +
          " holds " + std::to_string(num_blocks) + " KV blocks of " +
          std::to_string(config.block_size) + " tokens (" + detail::format_bytes(double(block)) +
          " each per rank for this model), fewer than one sequence of the model's context (" +
          std::to_string(m.seq_len) + " tokens) needs: " + std::to_string(max_blocks) +
          " blocks; set it to at least " + std::to_string(max_blocks * block) + " bytes");
    }
    cache = std::make_unique<PagedKvCache>(local_layers, num_blocks, config.block_size, kv_heads,
                                           head_dim, dtype);
    if (world->rank() == 0) {
      scheduler = std::make_unique<Scheduler>(
          SchedulerLimits{num_blocks, config.block_size, config.max_seqs, config.max_step_tokens,
                          m.seq_len, m.vocab});
    }
    // [command, chunks, tokens] + tokens + per chunk (start, length, sample,
    // blocks, table...).
    capacity = 3 + config.max_step_tokens + config.max_seqs * (4 + max_blocks);
    buffer = torch::zeros({capacity}, torch::kInt64);
  } catch (const Error& e) {
    error = e.what();
    kind = static_cast<int>(e.kind());
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree_on_error(*world, error, kind);

  try {
    mesh = std::make_unique<DeviceMesh>(world, shape);
    error.clear();
    try {
      factory->setup(*mesh, run);
      torch::manual_seed(0);
      model = build_model(run.model, *factory);
      if (mesh->size(Axis::kPP) > 1) {
        // Which parameters each stage's blocks read (the tied head reads
        // the embedding), then the stage assignment: placed_parameters()
        // names this stage's.
        model->find_block_reads(torch::zeros({1, 2}, torch::kInt64));
        model->set_stages(stage_of_blocks(model->blocks().size(), mesh->size(Axis::kPP)),
                          static_cast<int>(mesh->coord(Axis::kPP)));
      }
    } catch (const Error& e) {
      error = e.what();
      kind = static_cast<int>(e.kind());
    }
    detail::agree_on_error(*world, error, kind);
    load_weights();
    if (model->pipelined()) {
      // Other stages' parameters are not this rank's: release their memory.
      std::set<const void*> mine;
      for (const auto& p : model->placed_parameters()) mine.insert(p.tensor.unsafeGetTensorImpl());
      torch::NoGradGuard no_grad;
      for (const auto& p : model->all_parameters()) {
        if (!mine.count(p.tensor.unsafeGetTensorImpl())) p.tensor.set_data(torch::empty({0}));
      }
    }
    if (dtype != at::kFloat) cast_parameters(*model, dtype);
    for (auto& p : model->parameters()) p.set_requires_grad(false);
    model->eval();
    if (config.pack_weights) packed_layers = pack_for_inference(*model);
  } catch (const AgreedError&) {
    throw;
  } catch (const std::exception& e) {
    if (world->size() == 1) throw;
    detail::abort_job(e, "while loading the model for inference");
  }
}

void InferenceEngine::Impl::load_weights() {
  torch::NoGradGuard no_grad;
  const std::vector<PlacedParameter> params = model->placed_parameters();
  if (source.kind == "checkpoint") {
    // Each rank reads the hyperslab its placement names, whatever mesh
    // wrote the checkpoint (checkpoint.h): resharding on load.
    std::vector<checkpoint::Piece> pieces;
    for (const auto& p : params)
      pieces.push_back(checkpoint::Piece{"model/" + p.name, p.tensor, p.placement});
    // A mixture block's balancing bias (run state, every block's on every
    // rank): it chooses the experts.
    for (const auto& [name, bias] : router_biases(*model)) {
      pieces.push_back(checkpoint::Piece{std::string(kStatePrefix) + name, bias,
                                         Placement::replicated(bias.sizes().vec())});
    }
    checkpoint::load_pieces(*world, source.dir, pieces, "model/");
    return;
  }
  std::map<std::string, at::Tensor> weights(source.weights.begin(), source.weights.end());
  std::string error;
  for (const auto& p : params) {
    auto it = weights.find(p.name);
    if (it == weights.end()) {
      error = source.dir + ": the import has no tensor for parameter " + p.name;
      break;
    }
    p.tensor.copy_(local_piece(it->second.to(p.tensor.scalar_type()), p.placement));
  }
  source.weights.clear();
  detail::agree_on_error(*world, error, static_cast<int>(ErrorKind::kCheckpoint));
}

void InferenceEngine::Impl::pack(int64_t command, const StepPlan& plan) {
  int64_t* b = buffer.data_ptr<int64_t>();
  int64_t n = 0;
  b[n++] = command;
  b[n++] = static_cast<int64_t>(plan.chunks.size());
  b[n++] = plan.tokens();
  for (const auto& c : plan.chunks) {
    for (const int64_t t : c.tokens) b[n++] = t;
  }
  for (const auto& c : plan.chunks) {
    b[n++] = c.start;
    b[n++] = static_cast<int64_t>(c.tokens.size());
    b[n++] = c.sample ? 1 : 0;
    b[n++] = static_cast<int64_t>(c.blocks.size());
    for (const int32_t block : c.blocks) b[n++] = block;
  }
  KOLOS_CHECK(n <= capacity, "a step of ", n, " words overflows the broadcast of ", capacity);
}

StepBatch InferenceEngine::Impl::unpack() const {
  const int64_t* b = buffer.data_ptr<int64_t>();
  StepBatch batch;
  const int64_t chunks = b[1], tokens = b[2];
  int64_t n = 3;
  batch.tokens.assign(b + n, b + n + tokens);
  n += tokens;
  for (int64_t i = 0; i < chunks; ++i) {
    StepChunk c;
    c.start = b[n++];
    c.length = b[n++];
    c.sample = b[n++] != 0;
    const int64_t blocks = b[n++];
    for (int64_t j = 0; j < blocks; ++j) c.blocks.push_back(static_cast<int32_t>(b[n++]));
    batch.chunks.push_back(std::move(c));
  }
  return batch;
}

at::Tensor InferenceEngine::Impl::forward(const StepBatch& batch) {
  torch::NoGradGuard no_grad;
  cache->begin_step(batch);
  const int64_t stages = mesh->size(Axis::kPP), stage = mesh->coord(Axis::kPP);
  // This stage's blocks [first, last); the head is the model's last block.
  const size_t blocks = model->blocks().size();
  size_t first = 0, last = blocks;
  if (model->pipelined()) {
    while (!model->is_local(first)) ++first;
    last = first;
    while (last < blocks && model->is_local(last)) ++last;
  }
  const bool has_head = last == blocks;
  const auto step_tokens = static_cast<int64_t>(batch.tokens.size());
  std::vector<int64_t> rows;
  int64_t row = 0;
  for (const StepChunk& c : batch.chunks) {
    row += c.length;
    if (c.sample) rows.push_back(row - 1);
  }
  at::Tensor hidden;
  {
    AttentionCacheScope scope(cache.get());
    at::Tensor input;
    if (stage == 0) {
      input = torch::tensor(batch.tokens, torch::kInt64).unsqueeze(0);  // [1, T]
    } else {
      // The previous stage's output, from its rank of the same tp coordinate.
      input = torch::empty({1, step_tokens, run.model.hidden}, torch::TensorOptions().dtype(dtype));
      mesh->group(Axis::kPP)->recv(input, static_cast<int>(stage - 1))->wait();
    }
    hidden = model->forward(input, first, has_head ? blocks - 1 : last);  // [1, T, H]
  }
  if (!has_head) {
    mesh->group(Axis::kPP)->send(hidden.contiguous(), static_cast<int>(stage + 1))->wait();
  }
  if (rows.empty()) return at::Tensor();
  const int64_t vocab = run.model.vocab;
  at::Tensor logits;
  if (has_head) {
    hidden = hidden.index_select(1, torch::tensor(rows, torch::kInt64));
    logits = model->forward(hidden, blocks - 1, blocks)[0].to(at::kFloat);  // [R, V(local)]
    const int64_t tp = mesh->size(Axis::kTP);
    if (tp > 1) {
      // Vocabulary-parallel head: rank r holds rows [r * chunk, ...) of the
      // vocabulary, the last rank fewer (the placement's padding).
      const int64_t chunk = (vocab + tp - 1) / tp;
      at::Tensor local = torch::zeros({logits.size(0), chunk}, logits.options());
      local.narrow(1, 0, logits.size(1)).copy_(logits);
      at::Tensor all = torch::empty({tp, logits.size(0), chunk}, logits.options());
      mesh->group(Axis::kTP)->all_gather_flat(all, local)->wait();
      logits = all.permute({1, 0, 2}).reshape({logits.size(0), tp * chunk}).narrow(1, 0, vocab);
    }
    KOLOS_CHECK_EQ(logits.size(1), vocab, "the head's logits per token");
    logits = logits.contiguous();
  }
  if (stages > 1 && mesh->coord(Axis::kTP) == 0) {
    // The last stage hands the logits to rank 0 (stage 0, tp 0).
    if (has_head) {
      mesh->group(Axis::kPP)->send(logits, 0)->wait();
    } else if (stage == 0) {
      logits = torch::empty({static_cast<int64_t>(rows.size()), vocab}, torch::kFloat);
      mesh->group(Axis::kPP)->recv(logits, static_cast<int>(stages - 1))->wait();
    }
  }
  return logits;
}

InferenceEngine::InferenceEngine(const std::string& path, const InferenceConfig& config,
                                 comm::ProcessGroupPtr world, std::vector<std::string> plugin_path)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  impl_->world = std::move(world);
  impl_->setup(path, std::move(plugin_path));
}

InferenceEngine::~InferenceEngine() = default;

bool InferenceEngine::is_driver() const { return impl_->world->rank() == 0; }

Scheduler& InferenceEngine::scheduler() {
  KOLOS_CHECK(impl_->scheduler != nullptr, "the scheduler lives on rank 0 only");
  return *impl_->scheduler;
}

std::vector<TokenEvent> InferenceEngine::step() {
  Scheduler& s = scheduler();
  const StepPlan plan = s.schedule();
  KOLOS_CHECK(!plan.empty() || !s.has_work(), "a step scheduled nothing with ", s.num_waiting(),
              " requests waiting and ", s.num_running(), " running");
  if (plan.empty()) return {};
  impl_->pack(kStep, plan);
  if (impl_->world->size() > 1) impl_->world->broadcast(impl_->buffer, 0)->wait();
  const StepBatch batch = impl_->unpack();
  const auto started = std::chrono::steady_clock::now();
  at::Tensor logits = impl_->forward(batch);
  const auto forwarded = std::chrono::steady_clock::now();
  // The sequences' tokens, on the threads of the products.
  std::vector<int64_t> requests;
  for (const auto& c : plan.chunks) {
    if (c.sample) requests.push_back(c.request);
  }
  const std::vector<int64_t> sampled = requests.empty()
                                           ? std::vector<int64_t>{}
                                           : s.sample_rows(requests, logits.data_ptr<float>(),
                                                           logits.size(1), at::get_num_threads());
  StepTimes& t = impl_->times;
  const double forward = std::chrono::duration<double>(forwarded - started).count();
  const bool decode = std::all_of(plan.chunks.begin(), plan.chunks.end(),
                                  [](const auto& c) { return c.tokens.size() == 1 && c.sample; });
  ++t.steps;
  t.forward_s += forward;
  if (decode) {
    ++t.decode_steps;
    t.decode_forward_s += forward;
  }
  t.sample_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - forwarded).count();
  return s.complete(plan, sampled);
}

void InferenceEngine::stop() {
  if (impl_->world->size() == 1) return;
  impl_->pack(kStop, StepPlan{});
  impl_->world->broadcast(impl_->buffer, 0)->wait();
}

void InferenceEngine::idle() {
  if (impl_->world->size() == 1) return;
  impl_->pack(kIdle, StepPlan{});
  impl_->world->broadcast(impl_->buffer, 0)->wait();
}

void InferenceEngine::run(const std::function<void(const TokenEvent&)>& on_event) {
  while (scheduler().has_work()) {
    for (const TokenEvent& e : step()) {
      if (on_event) on_event(e);
    }
  }
  stop();
}

void InferenceEngine::follow() {
  KOLOS_CHECK(!is_driver(), "follow() is for the ranks other than 0");
  while (true) {
    impl_->world->broadcast(impl_->buffer, 0)->wait();
    const int64_t command = impl_->buffer.data_ptr<int64_t>()[0];
    if (command == kStop) return;
    if (command == kIdle) continue;
    impl_->forward(impl_->unpack());
  }
}

const InferenceEngine::StepTimes& InferenceEngine::step_times() const { return impl_->times; }
const ModelConfig& InferenceEngine::model() const { return impl_->run.model; }
int64_t InferenceEngine::num_blocks() const { return impl_->num_blocks; }

std::string InferenceEngine::describe() const {
  const ModelConfig& m = impl_->run.model;
  std::ostringstream out;
  out << m.name << " (" << m.layers << " layers, hidden " << m.hidden << ", heads " << m.heads;
  if (m.name != "gpt") out << ", kv_heads " << m.kv_heads;
  if (m.name == "mixtral") out << ", " << m.experts << " experts top " << m.top_k;
  out << ", vocab " << m.vocab << ", context " << m.seq_len << ") from " << impl_->source.kind
      << " " << impl_->source.dir << " | " << impl_->factory->name() << " over "
      << impl_->mesh->size(Axis::kTP) << " rank" << (impl_->mesh->size(Axis::kTP) == 1 ? "" : "s");
  if (impl_->mesh->size(Axis::kPP) > 1) {
    out << " x " << impl_->mesh->size(Axis::kPP) << " pipeline stages";
  }
  out << " | " << impl_->config.precision;
  if (impl_->packed_layers > 0) {
    out << ", " << impl_->packed_layers << " linear layers packed (" << PackedLinear::kernel_name()
        << ")";
  } else if (impl_->config.pack_weights && impl_->dtype == at::kFloat) {
    out << ", weights not packed (this CPU has neither AVX2 nor LibTorch's oneDNN linear "
           "operators)";
  }
  out << " | KV cache " << impl_->num_blocks << " blocks of " << impl_->config.block_size
      << " tokens";
  return out.str();
}

}  // namespace kolos::inference
