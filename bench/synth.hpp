// Synthesized HLO modules for the benchmarks: as large, or with as many instructions,
// as a benchmark needs, where the corpus has no such graph.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace neffcache::bench {

// A module shaped like a real training graph whose weights are constants: one
// computation of `constants` bf16 constants of `literal_bytes` each, every one added
// into a running sum, so ids, operands and shapes are all exercised.
inline std::string synthesize_module(std::size_t total_bytes, std::size_t literal_bytes) {
  std::mt19937_64 rng(1);
  std::string weights(literal_bytes, '\0');
  for (auto& c : weights) c = static_cast<char>(rng());
  auto message = [](auto&& write) {
    std::string out;
    {
      google::protobuf::io::StringOutputStream s(&out);
      google::protobuf::io::CodedOutputStream o(&s);
      write(o);
    }
    return out;
  };
  auto field = [](google::protobuf::io::CodedOutputStream& o, uint32_t number, const std::string& bytes) {
    o.WriteTag(number << 3 | 2);
    o.WriteVarint32(static_cast<uint32_t>(bytes.size()));
    o.WriteString(bytes);
  };
  const std::string shape = message([&](auto& o) {
    o.WriteTag(2 << 3), o.WriteVarint32(16);  // BF16
    std::string dims = message([&](auto& d) { d.WriteVarint64(literal_bytes / 2 / 256), d.WriteVarint64(256); });
    field(o, 3, dims);
  });
  std::string computation;
  google::protobuf::io::StringOutputStream cs(&computation);
  {
    google::protobuf::io::CodedOutputStream c(&cs);
    int64_t id = 1, sum = 0;
    for (std::size_t made = 0; made < total_bytes; made += literal_bytes) {
      std::string literal = message([&](auto& o) { field(o, 1, shape), field(o, 13, weights); });
      int64_t constant = id++;
      field(c, 2, message([&](auto& o) {
              field(o, 1, fmt::format("constant.{}", constant));
              field(o, 2, "constant");
              field(o, 3, shape);
              field(o, 8, literal);
              o.WriteTag(35 << 3), o.WriteVarint64(static_cast<uint64_t>(constant) << 32);
            }));
      if (sum != 0) {
        int64_t add = id++;
        field(c, 2, message([&](auto& o) {
                field(o, 1, fmt::format("add.{}", add));
                field(o, 2, "add");
                field(o, 3, shape);
                o.WriteTag(35 << 3), o.WriteVarint64(static_cast<uint64_t>(add) << 32);
                std::string ops = message([&](auto& p) {
                  p.WriteVarint64(static_cast<uint64_t>(sum) << 32);
                  p.WriteVarint64(static_cast<uint64_t>(constant) << 32);
                });
                field(o, 36, ops);
              }));
        sum = add;
      } else {
        sum = constant;
      }
    }
  }
  return message([&](auto& o) { field(o, 1, "synthetic"), field(o, 3, computation); });
}

// The 34-graph Llama-3-70B pre-compile of the Neuron notes, scaled. The notes give its
// range (9.8 s to 225 s per graph on trn1), not its 34 figures: the graphs spread
// geometrically over that range, each a synthesized module whose instruction count
// makes fake-neuronx-cc (at `rate` instructions per second) take `scale` of its time.
inline constexpr int k_workload_graphs = 34;

// A module of about `instructions` instructions (a chain of c small constants and c - 1
// adds: 2c - 1 instructions, at least 1), so that fake-neuronx-cc's time, and with
// NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION its peak, follow the count.
inline std::string chain_module(double instructions) {
  const auto constants = static_cast<std::size_t>(std::max(1.0, (instructions + 1) / 2));
  return synthesize_module(constants * 512, 512);
}

inline std::vector<std::string> llama_workload(double scale, double rate) {
  constexpr double fastest = 9.8, slowest = 225;
  std::vector<std::string> graphs;
  for (int k = 0; k < k_workload_graphs; ++k) {
    const double seconds = fastest * std::pow(slowest / fastest, k / double(k_workload_graphs - 1)) * scale;
    graphs.push_back(chain_module(seconds * rate));
  }
  return graphs;
}

}  // namespace neffcache::bench
