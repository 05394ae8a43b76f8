// The registry of the plugins' memory terms and rank_memory(), the one
// function the core's estimate and the planner call (plugin_terms.h).
//
// The model of each term (docs/reliability.md, "Memory estimate"):
//   model states  the gradients role's plugin (or the memory role's, which
//                 then holds them): parameters, gradients, optimizer.
//   activations   what autograd saves per block for one micro-batch, times
//                 the micro-batches a stage holds at once (the pipeline
//                 role's count), plus the loss's logits: the inputs and
//                 outputs of the two norms, q, k, v, the attention output,
//                 the MLP's input to its activation and the activation's
//                 output, and what the sequence role's attention keeps; the
//                 layers role says what divides over the tensor group.
//                 train.recompute: a "full" block keeps its input only, plus
//                 one block's activations while it is recomputed; a
//                 "selective" one drops the attention probabilities.
//   temporaries   backward's high point: the attention core's (the sequence
//                 role's) and the two largest weight gradients before they
//                 are added.
//   allocator     an allowance of 25% of the tensors above for what the
//                 allocator keeps and MPI's buffers: fitted, not derived.
//   runtime       the process before the model exists: measured by the
//                 caller, or the planner's assumption for a device.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>

#include "kolos/core/format.h"
#include "kolos/core/plugin_terms.h"

namespace kolos {

namespace {

using detail::format_bytes;

std::string fmt_count(double n) {
  if (n >= 1e12) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.3g", n);  // scientific beyond a trillion
    return buffer;
  }
  return detail::format_count(n);
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, PluginTerms> terms;
};

Registry& registry() {
  static Registry r;
  return r;
}

// Parameters of one transformer block holding `experts` of each mixture
// block's experts. GPT: q, o and k, v of kv_heads heads with biases, a GELU
// MLP with biases, two layer norms. LLaMA: the same projections without
// biases, the SwiGLU MLP's three matrices, two RMSNorms.
double block_params(const ModelDims& m, double experts) {
  const double h = m.hidden;
  const double kv = m.kv_heads * h / m.heads;
  if (m.llama) {
    // A mixture block's MLP: its experts, the shared ones and the router
    // (mean over blocks).
    const double mlp = (1 - m.moe_share) * 3 * h * m.inner +
                       m.moe_share * ((experts + m.shared) * 3 * h * m.inner + h * m.experts);
    return 2 * h * h + 2 * h * kv + mlp + 2 * h;
  }
  return 2 * (h * h + h) + 2 * (h * kv + kv) + 2 * h * m.inner + m.inner + h + 4 * h;
}

// The embedding block's parameters (GPT: token and position tables; LLaMA:
// tokens only) and the head block's own (GPT: the final norm, the head
// reading wte; LLaMA: the final RMSNorm and the untied head).
double embedding_params(const ModelDims& m) {
  return m.llama ? m.vocab * m.hidden : (m.vocab + m.seq) * m.hidden;
}
double head_params(const ModelDims& m) {
  return m.llama ? m.hidden + m.vocab * m.hidden : 2 * m.hidden;
}

// What the rank at pipeline stage `stage` holds: the first stages take
// ceil(layers / pp) blocks, the last the rest.
RankPiece piece_of(const MemoryQuery& q, int64_t stage) {
  const ModelDims& m = q.model;
  const double tp = static_cast<double>(q.tp);
  RankPiece p;
  p.stage = stage;
  p.details = q.details;
  p.blocks = std::ceil(m.layers / static_cast<double>(q.pp));
  if (stage == q.pp - 1) p.blocks = m.layers - p.blocks * static_cast<double>(q.pp - 1);
  p.blocks = std::max(0.0, p.blocks);
  p.embeddings = stage == 0;
  p.head = stage == q.pp - 1;
  p.block = block_params(m, m.experts / static_cast<double>(std::max<int64_t>(1, q.ep))) / tp;
  p.params = p.blocks * p.block;
  if (p.embeddings) p.params += embedding_params(m) / tp;
  if (p.head) {
    p.params += head_params(m) / tp;
    // GPT's head reads wte: a stage without the embedding holds a copy.
    if (!p.embeddings && !m.llama) p.params += m.vocab * m.hidden / tp;
  }
  p.largest = std::max({m.vocab * m.hidden, m.hidden * m.inner, m.hidden * m.hidden});
  return p;
}

// The blocks of stage `stage` that train.recompute acts on: every
// recompute_every-th block, counting from the model's first.
double recomputed_blocks(const MemoryQuery& q, int64_t stage, double blocks) {
  if (q.recompute == "none" || blocks <= 0) return 0;
  const double k = static_cast<double>(std::max<int64_t>(1, q.recompute_every));
  const double first = static_cast<double>(stage) * std::ceil(q.model.layers / q.pp);
  return std::ceil((first + blocks) / k) - std::ceil(first / k);  // multiples of k among them
}

// The plugin `name` of `role` with `hook`, or nullptr; `missing` says why
// not, for the table.
template <typename Hook>
const PluginTerms* ask(const std::string& role, const std::string& name, Hook PluginTerms::*hook,
                       std::string& missing) {
  const PluginTerms* t = plugin_terms(name);
  if (t != nullptr && t->*hook != nullptr) return t;
  missing = role + " plugin `" + name + "` registers no memory terms: not counted";
  return nullptr;
}

}  // namespace

std::string MemoryQuery::setting(const std::string& key, const std::string& fallback) const {
  const auto it = settings.find(key);
  return it == settings.end() ? fallback : it->second;
}

std::string RankPiece::count() const {
  return details ? fmt_count(params) + " local parameters" : std::string();
}

void register_plugin_terms(const PluginTerms& terms) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.terms.emplace(terms.name, terms).second) {
    throw std::logic_error("memory terms registered twice for plugin `" + terms.name + "`");
  }
}

const PluginTerms* plugin_terms(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.terms.find(name);
  return it == r.terms.end() ? nullptr : &it->second;
}

std::vector<std::string> plugin_terms_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [name, terms] : r.terms) out.push_back(name);
  return out;
}

int64_t exact_root(int64_t n, int k) {
  const auto r = static_cast<int64_t>(std::llround(std::pow(static_cast<double>(n), 1.0 / k)));
  for (int64_t q = std::max<int64_t>(1, r - 1); q <= r + 1; ++q) {
    int64_t p = 1;
    for (int i = 0; i < k; ++i) p *= q;
    if (p == n) return q;
  }
  return 0;
}

AttentionMemory dense_attention_memory(const MemoryQuery& q, double micro, double tokens) {
  const ModelDims& m = q.model;
  AttentionMemory a;
  a.kernel = "dense";
  // The softmax's probabilities, batch x heads x tokens x seq.
  a.saved = a.probabilities = micro * m.heads * tokens * m.seq;
  // Backward's scores, probabilities and their gradient: three of them.
  a.backward = 3 * q.element_bytes * micro * m.heads * tokens * m.seq / static_cast<double>(q.tp);
  return a;
}

// The roles' built-ins: a run without a tensor split, without a pipeline.
// The serial layers send nothing.
PluginTerms serial_terms() {
  PluginTerms t{"serial", "layers", [](const MemoryQuery&) { return TensorCut{}; }};
  t.traffic = [](const MemoryQuery&, std::vector<CollectiveCall>&) {};
  return t;
}
KOLOS_PLUGIN_TERMS(serial_terms());
KOLOS_PLUGIN_TERMS(PluginTerms{"single-stage", "pipeline", nullptr, nullptr,
                               [](const MemoryQuery&, int64_t, std::string*) { return 1.0; }});

double RankMemory::training_peak() const {
  double total = 0;
  for (const auto& t : terms) total += t.bytes;
  return total;
}

double RankMemory::host() const {
  double total = 0;
  for (const auto& t : terms) total += t.host ? t.bytes : 0;
  return total;
}

double RankMemory::peak() const { return std::max(training_peak(), build_peak); }

RankMemory rank_memory_at(const MemoryQuery& q, int64_t stage) {
  const ModelDims& m = q.model;
  RankMemory r;
  if (q.details) r.rank = q.pp > 1 ? "pipeline stage " + std::to_string(stage) : "every rank";
  const double elem = q.element_bytes, tp = static_cast<double>(q.tp);
  const RankPiece p = piece_of(q, stage);
  r.model_parameters = m.layers * block_params(m, m.experts) + embedding_params(m) + head_params(m);
  std::string missing;

  // Model states: the memory role's plugin holds them when there is one,
  // else the gradients role's.
  const bool memory = !q.memory.empty();
  double built = elem * p.params;  // what the build keeps (PluginTerms::built)
  bool built_into_place = false;
  if (const PluginTerms* t = ask(memory ? "memory" : "gradients", memory ? q.memory : q.gradients,
                                 &PluginTerms::states, missing)) {
    t->states(q, p, r.terms);
    if (t->built != nullptr) {
      built = t->built(q, p);
      built_into_place = true;
    }
  } else {
    r.terms.push_back(MemoryTerm{"model states", 0, missing});
  }
  for (const auto& t : r.terms) r.states += t.bytes;

  // Activations.
  const double micro = static_cast<double>(q.micro_batch);
  const double tokens = m.seq / static_cast<double>(q.sp);  // positions per rank
  const double bsh = micro * tokens * m.hidden;
  std::vector<std::string> unknown;
  TensorCut cut;
  if (const PluginTerms* t = ask("layers", q.layers, &PluginTerms::cut, missing)) {
    cut = t->cut(q);
  } else {
    unknown.push_back(missing);
  }
  AttentionMemory att = dense_attention_memory(q, micro, tokens);
  if (!q.sequence.empty()) {
    if (const PluginTerms* t = ask("sequence", q.sequence, &PluginTerms::attention, missing)) {
      att = t->attention(q, micro, tokens);
    } else {
      unknown.push_back(missing);
    }
  }
  double flight = 1;
  std::string schedule;  // the pipeline's words for its schedule
  if (q.pp > 1) {
    if (const PluginTerms* t = ask("pipeline", q.pipeline, &PluginTerms::in_flight, missing)) {
      flight = t->in_flight(q, stage, &schedule);
    } else {
      unknown.push_back(missing + " (one micro-batch in flight taken)");
    }
  }
  // LayerNorm (one fused op) keeps its input and output; RMSNorm, written
  // as ops, also the normalised product before the weight.
  double norms = (m.llama ? 6 : 4) * bsh;
  if (att.norms_over_tensor) norms = (norms - 2 * bsh) / tp + 2 * bsh;
  // SwiGLU keeps four inner-wide tensors (gate, silu(gate), up, their
  // product), GELU two; a mixture block runs each token through top_k
  // experts and the shared ones, and keeps two hidden-wide rows per routed
  // copy of a token: the experts' input (their linear layers keep it) and
  // their output (kept to be weighted by the router).
  const double wide = (m.llama ? 4 : 2) * (1 + m.moe_share * (m.top_k + m.shared - 1));
  const double routed = 2 * m.moe_share * m.top_k * bsh;
  const double rest = 4 * bsh + routed + wide * micro * tokens * m.inner + att.saved;
  const double per_block = elem * (norms / cut.norms + rest / cut.rest);
  double act = p.blocks * per_block * flight;
  std::string detail;
  if (q.details) {
    detail =
        "micro-batch " + std::to_string(q.micro_batch) + ", " + fmt_count(p.blocks) + " blocks";
  }
  const double chosen = recomputed_blocks(q, stage, p.blocks);
  if (chosen > 0 && q.recompute == "full") {
    // A recomputed block keeps its input only; in backward one block at a
    // time holds its activations again.
    const double input = elem * bsh / cut.kept_input;
    act = (chosen * input + (p.blocks - chosen) * per_block) * flight + per_block;
    if (q.details) detail += " (" + fmt_count(chosen) + " recomputed: their inputs + one block)";
  } else if (chosen > 0 && q.recompute == "selective" && att.probabilities > 0) {
    // A recomputed attention core keeps q, k, v (counted) but not its
    // probabilities.
    act -= chosen * elem * att.probabilities / cut.rest * flight;
    if (q.details) detail += " (" + fmt_count(chosen) + " without attention probabilities)";
  }
  if (q.pp > 1 && q.details) {
    detail += ", " + fmt_count(flight) + " micro-batches in flight (" +
              (schedule.empty() ? q.pipeline : schedule) + ")";
  }
  if (p.head) {
    // The logits, their log-softmax and its gradient (vocabulary cut by tp).
    // Under bf16/fp16 the loss widens the logits: the low-precision logits
    // and its gradient, and the fp32 copy, its log-softmax and its gradient.
    const double per_logit = q.mixed() ? 2 * elem + 3 * 4 : 3 * elem;
    const double logits = per_logit * micro * tokens * m.vocab / tp;
    act += logits;
    if (q.details) detail += " + logits " + format_bytes(logits);
  }
  for (const auto& u : unknown) detail += (detail.empty() ? "" : "; ") + u;
  r.terms.push_back(MemoryTerm{"activations", act, detail});
  // Backward's temporaries at their high point: the attention core's and
  // the gradients of the largest weights (the embedding's dense gradient and
  // the tied head's) before they are added into the buffers that keep them.
  const double weights = 2 * elem * p.largest / tp;
  r.terms.push_back(MemoryTerm{
      "temporaries", att.backward + weights,
      q.details ? "attention gradients " + format_bytes(att.backward) + " (" + att.kernel +
                      ") + 2 largest weight gradients " + format_bytes(weights)
                : std::string()});
  // What the process holds beyond the live tensors (plugin_terms.h): fitted
  // to measured runs (docs/reliability.md); not derived.
  const double host = r.host(), tensors = r.training_peak() - host;
  const auto pct = [](double share) { return std::to_string(std::lround(100 * share)) + "%"; };
  double allowance = 0, host_share = 0;
  std::string why;
  if (q.heap_tuned) {
    const double active = act + att.backward + weights;
    allowance =
        kHeapStatesShare * (tensors - active) + kHeapActivationsShare * active + kHeapBuffers;
    host_share = kHeapStatesShare;
    if (q.details) {
      why = pct(kHeapStatesShare) + " of the states' side, " + pct(kHeapActivationsShare) +
            " of activations and temporaries, + " + format_bytes(kHeapBuffers) +
            ": staging, MPI buffers, threads (fitted)";
    }
  } else {
    allowance = kAllocatorShare * tensors + kProcessBuffers;
    host_share = kAllocatorShare;
    if (q.details) {
      why = pct(kAllocatorShare) + " of the tensors + " + format_bytes(kProcessBuffers) +
            ": freed memory glibc's heap keeps, MPI buffers, threads (fitted)";
    }
  }
  r.terms.push_back(MemoryTerm{"allocator, buffers", allowance, why});
  if (host > 0) {
    r.terms.push_back(
        MemoryTerm{"allocator, host", host_share * host,
                   q.details ? pct(host_share) + " of the host tier's tensors" : std::string(),
                   /*host=*/true});
  }
  r.terms.push_back(
      MemoryTerm{"runtime", q.runtime_bytes,
                 q.details ? "LibTorch, MPI, plugins: " + q.runtime_source : std::string()});
  r.build_peak = q.runtime_bytes + built + 2 * elem * p.largest;
  if (q.details) {
    r.build_detail =
        std::string("runtime + ") +
        (built_into_place ? "what the states' plugin keeps as it builds, one block whole"
                          : "local parameters whole") +
        " + initialisation temporaries";
  }
  return r;
}

RankMemory rank_memory(const MemoryQuery& q) {
  RankMemory first = rank_memory_at(q, 0);
  if (q.pp <= 1) return first;
  RankMemory last = rank_memory_at(q, q.pp - 1);
  return last.peak() > first.peak() ? last : first;
}

}  // namespace kolos
