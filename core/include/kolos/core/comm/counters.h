// The traffic counters behind ProcessGroup::stats(), as each backend keeps
// them: one count of bytes and one of calls per operation type, added to
// from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kolos/core/comm/process_group.h"

namespace kolos::comm {

class CommCounters {
 public:
  void add(OpType op, uint64_t bytes) {
    const auto i = static_cast<size_t>(op);
    bytes_[i].fetch_add(bytes, std::memory_order_relaxed);
    calls_[i].fetch_add(1, std::memory_order_relaxed);
  }
  CommStats snapshot() const {
    CommStats out;
    for (size_t i = 0; i < out.bytes.size(); ++i) {
      out.bytes[i] = bytes_[i].load(std::memory_order_relaxed);
      out.calls[i] = calls_[i].load(std::memory_order_relaxed);
    }
    return out;
  }
  void reset() {
    for (size_t i = 0; i < bytes_.size(); ++i) {
      bytes_[i].store(0, std::memory_order_relaxed);
      calls_[i].store(0, std::memory_order_relaxed);
    }
  }

 private:
  std::array<std::atomic<uint64_t>, static_cast<size_t>(OpType::kCount)> bytes_{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(OpType::kCount)> calls_{};
};

}  // namespace kolos::comm
