// Key derivation throughput: canonical graph hash in MB/s (largest corpus file and a
// synthesized module of 100+ MB), flags hashes per second, entries walked per second.
// Prints a markdown table of median, min and max over repetitions.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <neffcache/neffcache.hpp>

#include "paths.hpp"
#include "synth.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Row {
  std::string what, unit;
  std::vector<double> samples;
};

template <class F>
double seconds(F&& f) {
  auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void print_table(std::vector<Row>& rows) {
  fmt::print("| benchmark | median | min | max | unit | runs |\n|---|---:|---:|---:|---|---:|\n");
  for (auto& r : rows) {
    std::sort(r.samples.begin(), r.samples.end());
    double median = r.samples[r.samples.size() / 2];
    fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {} | {} |\n", r.what, median, r.samples.front(),
               r.samples.back(), r.unit, r.samples.size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"neffcache key derivation benchmarks"};
  int reps = 7;
  std::size_t synth_mb = 100;
  int walk_entries = 100000;
  std::string corpus = test::path::corpus;
  app.add_option("--reps", reps, "repetitions per benchmark")->capture_default_str();
  app.add_option("--synth-mb", synth_mb, "size of the synthesized module in MB")->capture_default_str();
  app.add_option("--walk-entries", walk_entries, "entries in the walked cache")->capture_default_str();
  app.add_option("--corpus", corpus, "folder of HLO files")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<Row> rows;
  auto hash_rate = [&](const std::string& what, const std::string& bytes) {
    Row r{what, "MB/s", {}};
    for (int i = 0; i < reps; ++i) {
      double s = seconds([&] {
        auto a = neffcache::analyze_hlo(bytes);
        if (!a) throw std::runtime_error(a.error().message);
      });
      r.samples.push_back(static_cast<double>(bytes.size()) / 1e6 / s);
    }
    rows.push_back(std::move(r));
  };

  std::string largest_name;
  std::string largest;
  for (const auto& e : fs::directory_iterator(corpus)) {
    if (e.path().extension() != ".pb" || e.file_size() <= largest.size()) continue;
    auto bytes = neffcache::detail::read_file(e.path().string());
    if (bytes) largest = std::move(*bytes), largest_name = e.path().filename().string();
  }
  hash_rate(fmt::format("canonical hash, {} ({:.1f} MB)", largest_name, largest.size() / 1e6), largest);

  std::string synth = neffcache::bench::synthesize_module(synth_mb * 1000 * 1000, 256 * 1024);
  hash_rate(fmt::format("canonical hash, synthesized module ({:.0f} MB)", synth.size() / 1e6), synth);
  synth = std::string();

  {
    std::vector<std::string> flags{"--target=trn1", "-O1", "--model-type=transformer",
                                   "--enable-saturate-infinity", "--auto-cast=none"};
    Row r{"flags hash, 5 flags (JSON form)", "k hashes/s", {}};
    constexpr int k_hashes = 200000;
    for (int i = 0; i < reps; ++i) {
      std::size_t sink = 0;
      double s = seconds([&] {
        for (int k = 0; k < k_hashes; ++k) sink += neffcache::flags_hash(flags).size();
      });
      if (sink == 0) return 1;
      r.samples.push_back(k_hashes / s / 1e3);
    }
    rows.push_back(std::move(r));
  }

  {
    std::string tmpl = (fs::temp_directory_path() / "neffcache-bench-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) return 1;
    fs::path root = tmpl;
    for (int i = 0; i < walk_entries; ++i) {
      fs::path dir = root / fmt::format("neuronxcc-{}", i % 2) / fmt::format("MODULE_{:020x}+d7517139", i);
      fs::create_directories(dir);
      for (const char* name : {"model.hlo_module.pb", "compile_flags.json"}) {
        int fd = ::open((dir / name).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) ::close(fd);
      }
    }
    Row r{fmt::format("entry walk with states, {} entries (warm)", walk_entries), "k entries/s", {}};
    for (int i = 0; i < reps; ++i) {
      int seen = 0;
      double s = seconds([&] {
        auto ok = neffcache::for_each_entry(root.string(), [&](const neffcache::EntryRef& e) {
          seen += neffcache::entry_state(e) == neffcache::EntryState::pending;
        });
        if (!ok) throw std::runtime_error(ok.error().message);
      });
      if (seen != walk_entries) throw std::runtime_error("walk missed entries");
      r.samples.push_back(seen / s / 1e3);
    }
    rows.push_back(std::move(r));
    fs::remove_all(root);
  }

  print_table(rows);
  return 0;
}
