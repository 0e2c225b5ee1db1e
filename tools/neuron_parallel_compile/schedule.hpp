// How the nodes of a multi-node neuron_parallel_compile share the entries of one cache
// (--node_id, --world_size, --static_schedule). Every node runs the tool on the same
// shared cache; entry locks (S3 leases) make each entry compile once whatever the
// shares say, so a share only decides what a node takes first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/core/detail/digest.hpp>
#include <neffcache/compile/scheduler.hpp>

namespace neffcache::npc {

// A static worker steals from the slices of this many workers before it.
inline constexpr int k_steal_neighbours = 8;

struct NodePlan {
  int node_id = 0;
  int world_size = 1;    // 1: one node, which owns everything
  int num_parallel = 1;  // workers per node: global worker id = num_parallel * node_id + i
};

// Dynamic schedule: the node whose share an entry is, from its path in the cache
// (neuronxcc-*/MODULE_*): the same on every node, without knowing the other entries,
// so graphs can be shared while they are being extracted.
inline int owner_node(std::string_view rel, int world_size) {
  if (world_size <= 1) return 0;
  const std::string h = detail::md5_hex(rel).substr(0, 8);
  return static_cast<int>(std::stoul(h, nullptr, 16) % static_cast<unsigned long>(world_size));
}

// Dynamic schedule: this node's own entries first, the others' after them.
inline Priority dynamic_share(std::string_view rel, const NodePlan& p) {
  return owner_node(rel, p.world_size) == p.node_id ? Priority::background : Priority::deferred;
}

// Static schedule over `n` entries sorted by path: the W = num_parallel * world_size
// workers own consecutive slices, worker g the indices [g*n/W, (g+1)*n/W). This node's
// workers take their own slices first (background), then the slices of the
// k_steal_neighbours workers before each of them (deferred; worker 0 follows worker W-1);
// the rest is left to other nodes (nullopt). Our workers share one queue, so the
// neighbours of any of them are stolen from by all of them.
inline std::vector<std::optional<Priority>> static_shares(std::size_t n, const NodePlan& p) {
  const auto workers = static_cast<std::size_t>(p.num_parallel) * static_cast<std::size_t>(p.world_size);
  const auto first = static_cast<std::size_t>(p.num_parallel) * static_cast<std::size_t>(p.node_id);
  std::vector<std::optional<Priority>> share(n);
  for (std::size_t g = 0; g < workers; ++g) {
    std::optional<Priority> s;
    for (std::size_t k = 0; k < static_cast<std::size_t>(p.num_parallel) && s != Priority::background; ++k) {
      const std::size_t mine = first + k;
      const std::size_t behind = (mine + workers - g) % workers;  // how far g is before `mine`
      if (behind == 0) s = Priority::background;
      else if (behind <= k_steal_neighbours) s = Priority::deferred;
    }
    for (std::size_t i = g * n / workers; i < (g + 1) * n / workers; ++i) share[i] = s;
  }
  return share;
}

}  // namespace neffcache::npc
