// The content index measured (issue 19, item 6): what a twin's open costs against a hit,
// how many compiles twins of done graphs take, and what the lookup costs with a large
// index against an empty one. Every comparison is of two figures of the same repetition,
// alternating which goes first.
#include "bench_twins.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <neffcache/cache/index.hpp>
#include <neffcache/compile/twin.hpp>

#include "paths.hpp"
#include "synth.hpp"

namespace mount_bench {
namespace {

constexpr std::string_view k_compiler_dir = "neuronxcc-2.21.0";

const fs::path& corpus_hlo() {
  static const fs::path p = fs::path(test::path::corpus) / "gopjrt_tuple.hlo.pb";
  return p;
}

// An entry of `hlo` compiled with `flags` (a JSON list), as a client writes it: two
// entries of equal bytes and flags are twins whatever their names.
fs::path make_entry(const fs::path& root, const std::string& name, std::string_view hlo, std::string_view flags) {
  auto dir = root / k_compiler_dir / ("MODULE_" + name);
  fs::create_directories(dir);
  touch(dir / "compile_flags.json", flags);
  touch(dir / "model.hlo_module.pb", hlo);
  return dir;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Lines of the fake compiler's log: one per compile.
int compiles_logged(const fs::path& log) {
  std::ifstream in(log);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

// open + read of the first byte + close; the seconds it took.
double open_first_byte(const fs::path& p) {
  auto t0 = Clock::now();
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("open {}: {}", p.string(), std::strerror(errno)));
  char c;
  ssize_t n = ::pread(fd, &c, 1, 0);
  const double s = since(t0);
  ::close(fd);
  if (n != 1) throw std::runtime_error(fmt::format("read of {}: {}", p.string(), n < 0 ? std::strerror(errno) : "empty"));
  return s;
}

ino_t inode(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) throw std::runtime_error(fmt::format("stat {}: {}", p.string(), std::strerror(errno)));
  return st.st_ino;
}

// Waits until the daemon's start-up scan of the index is over.
void wait_for_scan(const Mount& m) {
  for (auto t0 = Clock::now(); since(t0) < 60; std::this_thread::sleep_for(std::chrono::milliseconds(10)))
    if (m.stats()["index"]["scan"] == "done") return;
  throw std::runtime_error("the daemon's start-up scan did not finish in 60 s");
}

// 1. A metadata twin of a done NEFF, opened until its first byte, against the done entry.
std::vector<Row> twin_open(const TwinOptions& o, const fs::path& work) {
  const fs::path backing = work / "twins-open-backing", mnt = work / "twins-open-mnt";
  const std::string hlo = slurp(corpus_hlo()), flags = R"(["--internal-bench=twin-open"])";
  const auto a = make_entry(backing, "a+twin", hlo, flags);
  const fs::path log = work / "twins-open.log";
  Mount m(backing.string(), mnt,
          {"NEFFCACHE_FAKE_RATE=0", fmt::format("NEFFCACHE_FAKE_NEFF_BYTES={}", o.neff_mib << 20),
           "NEFFCACHE_FAKE_LOG=" + log.string(), "TMPDIR=" + work.string()});
  note(fmt::format("twins: compiling a {} MiB NEFF through the mount", o.neff_mib));
  const fs::path a_neff = mnt / fs::relative(a, backing) / "model.neff";
  if (read_whole(a_neff) < (o.neff_mib << 20)) throw std::runtime_error("twins: the done NEFF is short");
  read_whole(a_neff);  // its pages cached, as those of a NEFF in use are
  const ino_t a_ino = inode(a / "model.neff");
  const std::string mib = fmt::format("{} MiB", o.neff_mib);
  Row twin("twins: open of a metadata twin of a done " + mib + " NEFF until its first byte", "ms", "<= 5",
           [](double v) { return v <= 5; });
  Row hit("twins: open of the done entry itself until its first byte", "ms");
  Row diff("twins: twin open - done open", "ms");
  Row linked("twins: twin NEFF is a link of the original (same inode), 1/0", "count", "= 1",
             [](double v) { return v == 1; });
  for (int r = 0; r < o.reps; ++r) {
    const auto b = make_entry(backing, fmt::format("b{}+twin", r), hlo, flags);
    const fs::path b_neff = mnt / fs::relative(b, backing) / "model.neff";
    double t_twin = 0, t_hit = 0;
    for (int k = 0; k < 2; ++k) {
      if ((k == 0) == (r % 2 == 0)) t_twin = open_first_byte(b_neff);
      else t_hit = open_first_byte(a_neff);
    }
    twin.samples.push_back(t_twin * 1000);
    hit.samples.push_back(t_hit * 1000);
    diff.samples.push_back((t_twin - t_hit) * 1000);
    linked.samples.push_back(inode(b / "model.neff") == a_ino ? 1 : 0);
  }
  if (int n = compiles_logged(log); n != 1)
    throw std::runtime_error(fmt::format("twins: {} compiles for one graph and its twins", n));
  return {std::move(twin), std::move(hit), std::move(diff), std::move(linked)};
}

// 2. Twins of done graphs opened through the mount: compiles (none) and their wall time.
std::vector<Row> twin_compiles(const TwinOptions& o, const fs::path& work) {
  const int n_twins = o.graphs * o.per_graph;
  Row compiles(fmt::format("twins: compiles for {} twins of {} done graphs", n_twins, o.graphs), "count", "0",
               [](double v) { return v == 0; });
  Row served(fmt::format("twins: twins served from the index (stats.json) of {}", n_twins), "count");
  Row wall(fmt::format("twins: wall time of the {} opens (+ read, one after another)", n_twins), "ms");
  std::vector<std::string> graphs;  // distinct graphs: their sizes differ
  for (int k = 0; k < o.graphs; ++k)
    graphs.push_back(neffcache::bench::synthesize_module(4096 * static_cast<std::size_t>(k + 1), 512));
  const std::string flags = R"(["--internal-bench=twin-many"])";
  for (int r = 0; r < o.reps; ++r) {
    const fs::path backing = work / fmt::format("twins-many-backing{}", r), mnt = work / "twins-many-mnt",
                   log = work / fmt::format("twins-many{}.log", r);
    std::vector<fs::path> done;
    for (int k = 0; k < o.graphs; ++k)
      done.push_back(make_entry(backing, fmt::format("g{}+many", k), graphs[static_cast<std::size_t>(k)], flags));
    Mount m(backing.string(), mnt, {"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_LOG=" + log.string()});
    for (const auto& d : done) read_whole(mnt / fs::relative(d, backing) / "model.neff");
    if (int n = compiles_logged(log); n != o.graphs)
      throw std::runtime_error(fmt::format("twins: {} compiles for {} graphs", n, o.graphs));
    std::vector<fs::path> twins;
    for (int k = 0; k < o.graphs; ++k)
      for (int t = 0; t < o.per_graph; ++t)
        twins.push_back(mnt /
                        fs::relative(make_entry(backing, fmt::format("g{}-t{}+many", k, t),
                                                graphs[static_cast<std::size_t>(k)], flags),
                                     backing) /
                        "model.neff");
    const auto before = m.stats()["twins"]["served"].get<double>();
    auto t0 = Clock::now();
    for (const auto& t : twins) read_whole(t);
    wall.samples.push_back(since(t0) * 1000);
    served.samples.push_back(m.stats()["twins"]["served"].get<double>() - before);
    compiles.samples.push_back(compiles_logged(log) - o.graphs);
  }
  return {std::move(compiles), std::move(served), std::move(wall)};
}

// Writes `n` records of made-up identities (one entry each, as most are) into the index
// of `root`, in the layout cache/index.hpp documents, as fast as files can be created:
// records are never read but those of the identity looked up, so their entries need not
// exist. `flags_hash` is the one all of them share (one training job's flags).
void write_records(const fs::path& root, int n, const std::string& flags_hash) {
  const fs::path by_id = root / neffcache::k_index_dir / "by-id" / k_compiler_dir,
                 by_entry = root / neffcache::k_index_dir / "by-entry" / k_compiler_dir;
  fs::create_directories(by_id);
  fs::create_directories(by_entry);
  auto put = [](const std::string& path, const std::string& text) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      throw std::runtime_error(fmt::format("write {}: {}", path, std::strerror(errno)));
    ::close(fd);
  };
  std::mt19937_64 rng(42);
  for (int i = 0; i < n; ++i) {
    neffcache::ContentId id{std::string(k_compiler_dir),
                            fmt::format("{:016x}{:016x}{:016x}{:016x}", rng(), rng(), rng(), rng()), flags_hash};
    const std::string module = fmt::format("MODULE_{:020x}+rec", i);
    neffcache::IndexRecord rec;
    rec.entry = fmt::format("{}/{}", k_compiler_dir, module);
    rec.size = 4096, rec.xxh3 = fmt::format("{:016x}", rng()), rec.ino = 1000 + static_cast<uint64_t>(i);
    rec.mtime_ns = 1'700'000'000'000'000'000;
    rec.compile_seconds = 60;
    const std::string dir = (by_id / fmt::format("{}+{}", id.graph_sha256, id.flags_hash)).string();
    if (::mkdir(dir.c_str(), 0755) != 0) throw std::runtime_error(fmt::format("mkdir {}: {}", dir, std::strerror(errno)));
    put(fmt::format("{}/{}", dir, module), rec.to_json().dump() + "\n");
    put((by_entry / module).string(), id.str() + "\n");
  }
}

// The cache of the lookup figures: a done entry `hit+index`, indexed, and two pending
// entries, one its twin, one of a graph never compiled; `records` more records.
struct LookupCache {
  fs::path root, hit_dir, miss_dir;
  std::string hit_key, miss_key;
};

LookupCache make_lookup_cache(const fs::path& root, int records) {
  const std::string hlo = slurp(corpus_hlo()), flags = R"(["--internal-bench=index"])";
  LookupCache c{root, {}, {}, {}, {}};
  const auto done = make_entry(root, "hit+index", hlo, flags);
  touch(done / "model.neff", std::string(4096, 'n'));
  touch(done / "model.done");
  auto id = neffcache::entry_content_id(done.string());
  if (!id) throw std::runtime_error(id.error().message);
  if (auto a = neffcache::ContentIndex(root.string()).add(*id, neffcache::entry_in_cache(done.string())); !a)
    throw std::runtime_error(a.error().message);
  if (records > 0) write_records(root, records, id->flags_hash);
  c.hit_dir = make_entry(root, "twin+index", hlo, flags);
  c.hit_key = id->str();
  c.miss_dir = make_entry(root, "miss+index", hlo, R"(["--internal-bench=index-miss"])");
  auto miss = neffcache::entry_content_id(c.miss_dir.string());
  if (!miss) throw std::runtime_error(miss.error().message);
  c.miss_key = miss->str();
  return c;
}

// The median of `lookups` calls of `call`, in µs.
template <class F>
double median_call_us(int lookups, F&& call) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(lookups));
  for (int i = 0; i < lookups; ++i) {
    auto t0 = Clock::now();
    call();
    us.push_back(since(t0) * 1e6);
  }
  return median(std::move(us));
}

// 3. The lookup at the preparation of a pending entry, as the scheduler makes it.
std::vector<Row> index_lookup(const TwinOptions& o, const fs::path& work) {
  note(fmt::format("twins: writing an index of {} records", o.records));
  auto t0 = Clock::now();
  const LookupCache full = make_lookup_cache(work / "index-full", o.records);
  note(fmt::format("twins: written in {:.1f} s", since(t0)));
  const LookupCache empty = make_lookup_cache(work / "index-empty", 0);
  neffcache::CompileSettings settings;
  settings.content_index = true;
  auto miss = [&](const LookupCache& c) {
    // The whole of the library's step for an entry without a twin.
    if (neffcache::folder_reuse(c.miss_dir.string(), c.miss_key, settings))
      throw std::runtime_error("twins: a twin found for a graph never compiled");
  };
  auto hit = [&](const LookupCache& c) {
    // folder_reuse up to the publication: parse, find, check.
    auto id = neffcache::ContentId::parse(c.hit_key);
    neffcache::ContentIndex index(neffcache::root_of_entry(c.hit_dir.string()));
    if (!id || !index.find(*id, neffcache::entry_in_cache(c.hit_dir.string()), true))
      throw std::runtime_error("twins: no twin found for a compiled graph");
  };
  const std::string n = fmt::format("{}", o.records);
  Row miss_full("twins: index lookup of a pending entry, no twin (miss), " + n + " records", "us", "< 1000",
                [](double v) { return v < 1000; });
  Row miss_empty("twins: the same, empty index", "us");
  Row miss_ratio("twins: miss, " + n + " records / empty index", "ratio");
  Row hit_full("twins: index lookup of a pending entry with a twin (hit, without the publish), " + n + " records",
               "us", "< 1000", [](double v) { return v < 1000; });
  Row hit_empty("twins: the same, an index of that one record", "us");
  Row hit_ratio("twins: hit, " + n + " records / one record", "ratio");
  for (int r = 0; r < o.reps; ++r) {
    double m[2] = {0, 0}, h[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const bool large = (k == 0) == (r % 2 == 0);
      const LookupCache& c = large ? full : empty;
      m[large] = median_call_us(o.lookups, [&] { miss(c); });
      h[large] = median_call_us(o.lookups, [&] { hit(c); });
    }
    miss_full.samples.push_back(m[1]), miss_empty.samples.push_back(m[0]), miss_ratio.samples.push_back(m[1] / m[0]);
    hit_full.samples.push_back(h[1]), hit_empty.samples.push_back(h[0]), hit_ratio.samples.push_back(h[1] / h[0]);
  }
  std::vector<Row> rows{std::move(miss_full), std::move(miss_empty), std::move(miss_ratio),
                        std::move(hit_full), std::move(hit_empty), std::move(hit_ratio)};

  // The whole open of a pending entry (its compile by a fake compiler that takes no
  // time) through two mounts of the large cache at once, index on and off.
  const fs::path on_mnt = work / "index-on-mnt", off_mnt = work / "index-off-mnt";
  Mount on(full.root.string(), on_mnt, {"NEFFCACHE_FAKE_RATE=0"});
  Mount off(full.root.string(), off_mnt, {"NEFFCACHE_FAKE_RATE=0"}, {"-j", "2", "--no-content-index"});
  wait_for_scan(on);
  const int opens = 10;
  Row open_ratio(fmt::format("twins: open of a pending entry (a compile) through the mount, {} records: "
                             "index on / --no-content-index, median of {}", n, opens),
                 "ratio", "<= 1.05", [](double v) { return v <= 1.05; });
  Row open_on("twins: the same, index on", "ms");
  Row open_off("twins: the same, --no-content-index", "ms");
  const std::string hlo = slurp(corpus_hlo());
  for (int r = 0; r < o.reps; ++r) {
    double t[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const bool indexed = (k == 0) == (r % 2 == 0);
      std::vector<double> ms;
      for (int i = 0; i < opens; ++i) {
        const std::string name = fmt::format("p{}-{}-{}+open", r, indexed ? "on" : "off", i);
        auto e = make_entry(full.root, name, hlo, fmt::format(R"(["--internal-bench={}"])", name));
        ms.push_back(open_first_byte((indexed ? on_mnt : off_mnt) / fs::relative(e, full.root) / "model.neff") * 1000);
      }
      t[indexed] = median(std::move(ms));
    }
    open_ratio.samples.push_back(t[1] / t[0]);
    open_on.samples.push_back(t[1]);
    open_off.samples.push_back(t[0]);
  }
  rows.push_back(std::move(open_ratio));
  rows.push_back(std::move(open_on));
  rows.push_back(std::move(open_off));
  return rows;
}

}  // namespace

std::vector<Row> bench_twins(const TwinOptions& o, const fs::path& work) {
  // A part that fails is a failed row; the others still run.
  using Part = std::vector<Row> (*)(const TwinOptions&, const fs::path&);
  std::vector<Row> rows;
  for (auto [what, part] : std::vector<std::pair<std::string, Part>>{
           {"twins: twin open", twin_open}, {"twins: compiles for twins", twin_compiles},
           {"twins: index lookup", index_lookup}}) {
    try {
      for (auto& r : part(o, work)) rows.push_back(std::move(r));
    } catch (const std::exception& e) {
      Row failed(what, "");
      failed.failed = e.what();
      rows.push_back(std::move(failed));
    }
  }
  return rows;
}

}  // namespace mount_bench
