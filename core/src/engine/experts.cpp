// Expert parallelism's dispatch and combine (kolos/core/experts.h).
#include "kolos/core/experts.h"

#include <torch/torch.h>

#include <mutex>
#include <numeric>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/error.h"
#include "kolos/core/mesh.h"
#include "kolos/core/model.h"

namespace kolos {

namespace {

// Rows of `x` exchanged over `group`: send[r] rows to rank r, recv[r] from
// it. Backward exchanges the gradient's rows the other way.
class ExchangeRows : public torch::autograd::Function<ExchangeRows> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            std::vector<int64_t> send, std::vector<int64_t> recv,
                            comm::ProcessGroup* group) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return exchange(x, send, recv, *group);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<comm::ProcessGroup*>(ctx->saved_data["group"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {exchange(grads[0], recv, send, *group), at::Tensor(), at::Tensor(), at::Tensor()};
  }

  static at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& send,
                             const std::vector<int64_t>& recv, comm::ProcessGroup& group) {
    const int64_t rows = std::accumulate(recv.begin(), recv.end(), int64_t{0});
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] = rows;
    at::Tensor out = torch::empty(shape, x.options());
    group.all_to_all(out, x.contiguous(), recv, send)->wait();
    return out;
  }
};

}  // namespace

ExpertShard local_experts(const DeviceMesh* mesh, int64_t experts) {
  ExpertShard shard;
  shard.total = experts;
  shard.count = experts;
  const int64_t ep = mesh != nullptr ? mesh->size(expert_axis()) : 1;
  if (ep <= 1) return shard;
  KOLOS_CHECK_KIND(kConfig, experts % ep == 0, "parallel.expert.size = ", ep,
                   " does not divide model.experts = ", experts);
  shard.count = experts / ep;
  shard.first = mesh->coord(expert_axis()) * shard.count;
  shard.group = mesh->group(expert_axis()).get();
  return shard;
}

at::Tensor run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts,
                       const ExpertShard& shard,
                       const std::function<at::Tensor(int64_t, const at::Tensor&)>& expert) {
  KOLOS_CHECK(static_cast<int64_t>(counts.size()) == shard.total, "run_experts: ", counts.size(),
              " counts for ", shard.total, " experts");
  if (shard.group == nullptr) {
    std::vector<at::Tensor> outputs;
    int64_t at = 0;
    for (int64_t e = 0; e < shard.total; ++e) {
      outputs.push_back(expert(e, rows.narrow(0, at, counts[e])));
      at += counts[e];
    }
    return torch::cat(outputs, 0);
  }
  comm::ProcessGroup& group = *shard.group;
  const int64_t peers = group.size(), local = shard.count;
  // 1. The counts: rank r gets, from every peer, how many rows it sends to
  //    each of r's experts.
  at::Tensor sent = torch::tensor(counts, torch::kInt64);  // [peers * local]
  at::Tensor got = torch::empty({peers * local}, torch::kInt64);
  group.all_to_all(got, sent)->wait();
  const int64_t* from = got.data_ptr<int64_t>();  // [peer][local expert]
  std::vector<int64_t> send(peers, 0), recv(peers, 0);
  for (int64_t p = 0; p < peers; ++p) {
    for (int64_t j = 0; j < local; ++j) {
      send[p] += counts[p * local + j];
      recv[p] += from[p * local + j];
    }
  }
  // 2. The rows, to the ranks of their experts: received by peer, then by
  //    local expert.
  const at::Tensor received = ExchangeRows::apply(rows, send, recv, &group);
  // 3. Each local expert on all its rows: regroup by expert, run, restore.
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(received.size(0)));
  std::vector<int64_t> per_expert(local, 0);
  std::vector<int64_t> start(peers * local, 0);
  for (int64_t p = 0, at = 0; p < peers; ++p) {
    for (int64_t j = 0; j < local; ++j) {
      start[p * local + j] = at;
      at += from[p * local + j];
      per_expert[j] += from[p * local + j];
    }
  }
  for (int64_t j = 0; j < local; ++j) {
    for (int64_t p = 0; p < peers; ++p) {
      for (int64_t i = 0; i < from[p * local + j]; ++i) order.push_back(start[p * local + j] + i);
    }
  }
  const at::Tensor index = torch::tensor(order, torch::kInt64);
  const at::Tensor grouped = received.index_select(0, index);
  std::vector<at::Tensor> outputs;
  for (int64_t j = 0, at = 0; j < local; ++j) {
    outputs.push_back(expert(j, grouped.narrow(0, at, per_expert[j])));
    at += per_expert[j];
  }
  const at::Tensor done = torch::cat(outputs, 0);
  const at::Tensor back_in_received_order = done.index_select(0, torch::argsort(index));
  // 4. The outputs, back to the ranks that routed the rows.
  return ExchangeRows::apply(back_in_received_order, recv, send, &group);
}

namespace {
std::mutex routing_mutex;
RoutingRecord routing;
}  // namespace

void record_routing(int64_t block, const std::vector<int64_t>& kept, int64_t dropped,
                    double aux_loss) {
  std::lock_guard<std::mutex> lock(routing_mutex);
  std::vector<int64_t>& sum = routing.kept[block];
  if (sum.size() < kept.size()) sum.resize(kept.size(), 0);
  for (size_t e = 0; e < kept.size(); ++e) sum[e] += kept[e];
  routing.dropped += dropped;
  routing.aux_loss += aux_loss;
}

RoutingRecord take_routing() {
  std::lock_guard<std::mutex> lock(routing_mutex);
  RoutingRecord out = std::move(routing);
  routing = RoutingRecord{};
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> router_biases(const Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::string suffix = std::string(".") + kRouterBiasBuffer;
  for (const auto& [block, layer] : model.blocks()) {
    for (const auto& item : layer->named_buffers(/*recurse=*/true)) {
      const std::string& name = item.key();
      if (name.size() >= suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        out.emplace_back(block + "." + name, item.value());
      }
    }
  }
  return out;
}

void update_router_biases(const std::vector<std::pair<std::string, at::Tensor>>& biases,
                          const at::Tensor& load, double rate) {
  KOLOS_CHECK(load.dim() == 2 && load.size(0) == static_cast<int64_t>(biases.size()),
              "update_router_biases: ", biases.size(), " biases, load of shape ", load.sizes());
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < biases.size(); ++b) {
    const at::Tensor row = load[static_cast<int64_t>(b)].to(at::kFloat);
    const at::Tensor& bias = biases[b].second;
    bias.add_((row.mean() - row).sign().to(bias.device()), rate);
  }
}

}  // namespace kolos
