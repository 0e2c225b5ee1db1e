// The neffcache commands that work on a cache directory (put, ls, scan, compile), run as
// a user runs them: output, JSON parsed, exit codes, one-line errors.
#include <fcntl.h>
#include <sys/stat.h>

#include <cstdio>
#include <map>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "hlo_variants.hpp"
#include "support.hpp"

using namespace neffcache;
namespace fs = std::filesystem;

namespace {

using test::k_fake;
using test::k_fake_template;

// Runs the tool with a clean Neuron environment plus `env` (NAME=value words).
test::ToolRun tool(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  return test::run_tool(args, env);
}

// Stores a corpus graph with `put`; returns the entry folder it printed.
fs::path put(const fs::path& cache, const std::string& corpus_file, std::vector<std::string> flags = {}) {
  std::vector<std::string> args{"put", "--cache", cache.string(), "--compiler-version", "2.21.0",
                                (test::k_corpus / corpus_file).string()};
  for (const auto& f : flags) args.push_back("--flag=" + f);
  auto r = tool(args);
  REQUIRE(r.exit_code == 0);
  REQUIRE(!r.output.empty());
  return r.output.substr(0, r.output.size() - 1);
}

// The JSON document that ends a run's output (compile --json prints it last on stdout;
// stderr lines come before it or after it, so take the outermost braces).
nlohmann::json last_json(const std::string& output) {
  auto open = output.find("\n{");
  auto begin = output.rfind('{', 0) == 0 ? 0 : open + 1;
  auto end = output.rfind("\n}");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  return nlohmann::json::parse(output.substr(begin, end + 2 - begin));
}

// Rewrites a file's bytes in place (same inode), as disk damage would.
void write_file_in_place(const fs::path& p, const std::string& bytes) {
  std::FILE* f = std::fopen(p.c_str(), "r+b");
  REQUIRE(f);
  CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  std::fclose(f);
}

}  // namespace

TEST_CASE("neffcache put stores a graph as a pending entry", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  auto entry = put(cache, "rocm08_normal_9.hlo_proto.pb", {"--target=trn1", "-O1"});
  auto key = entry_key(test::slurp(test::k_corpus / "rocm08_normal_9.hlo_proto.pb"), {"--target=trn1", "-O1"}, "2.21.0");
  REQUIRE(key.has_value());
  CHECK(entry == (cache / key->relative_path()).string());
  CHECK(test::slurp(entry / fs::path("model.hlo_module.pb")) == test::slurp(test::k_corpus / "rocm08_normal_9.hlo_proto.pb"));
  CHECK(read_compile_flags((entry / fs::path("compile_flags.json")).string()).value() ==
        std::vector<std::string>{"--target=trn1", "-O1"});

  // The same graph again: the entry is kept as it is.
  test::spit(entry / fs::path("model.log"), "an earlier failure");
  auto again = tool({"put", "--cache", cache.string(), "--compiler-version", "2.21.0", "--json", "--flag=--target=trn1",
                     "--flag=-O1", (test::k_corpus / "rocm08_normal_9.hlo_proto.pb").string()});
  REQUIRE(again.exit_code == 0);
  auto j = nlohmann::json::parse(again.output);
  CHECK(j["created"] == false);
  CHECK(j["path"] == entry.string());
  CHECK(fs::exists(entry / fs::path("model.log")));

  SECTION("a file that is no HLO is refused and nothing is created") {
    test::spit(dir / "junk.pb", "this is not a protobuf \xff\xff");
    test::check_one_line_error(tool({"put", "--cache", (dir / "other").string(), "--compiler-version", "2.21.0",
                               (dir / "junk.pb").string()}),
                         "junk.pb");
    CHECK_FALSE(fs::exists(dir / "other"));
  }
  SECTION("the cache comes from NEURON_CC_FLAGS --cache_dir before NEURON_COMPILE_CACHE_URL") {
    auto r = tool({"put", "--compiler-version", "2.21.0", (test::k_corpus / "gopjrt_tuple.hlo.pb").string()},
                  {"NEURON_CC_FLAGS=--cache_dir=" + (dir / "from-flags").string() + " --target=trn1",
                   "NEURON_COMPILE_CACHE_URL=" + (dir / "from-url").string()});
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.rfind((dir / "from-flags/neuronxcc-2.21.0/MODULE_").string(), 0) == 0);
    CHECK(r.output.ends_with("+e30acd3a\n"));  // flags hash of ["--target=trn1"]: the wrapper option is left out
    CHECK_FALSE(fs::exists(dir / "from-url"));
  }
  SECTION("an s3:// cache without credentials is refused with one line") {
    test::check_one_line_error(tool({"put", "--cache", "s3://bucket/prefix", "--compiler-version", "2.21.0",
                                     (test::k_corpus / "gopjrt_tuple.hlo.pb").string()},
                                    {"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_PROFILE=", "HOME=/nonexistent",
                                     "AWS_EC2_METADATA_DISABLED=true"}),
                               "s3://bucket/prefix: no S3 credentials");
  }
}

TEST_CASE("neffcache ls and scan report every entry's state", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  auto pending = put(cache, "gopjrt_tuple.hlo.pb");
  auto failed = put(cache, "gopjrt_x_squared.hlo.pb");
  auto done = put(cache, "rocm08_normal_9.hlo_proto.pb");
  auto stale = put(cache, "spu_credit_fraud_predict.hlo.pb");
  test::spit(failed / fs::path("model.log"), "error: no");
  test::spit(done / fs::path("model.neff"), std::string(1000, 'n'));
  test::spit(done / fs::path("model.done"), "");
  test::spit(stale / fs::path("model.hlo_module.pb.lock"), "");  // an existence lock...
  fs::last_write_time(stale / fs::path("model.hlo_module.pb.lock"), fs::file_time_type::clock::now() - std::chrono::hours(3));  // ...hours old

  auto r = tool({"ls", "--cache", cache.string(), "--json"});
  REQUIRE(r.exit_code == 0);
  auto list = nlohmann::json::parse(r.output);
  REQUIRE(list.size() == 4);
  std::map<std::string, nlohmann::json> by_path;
  for (auto& e : list) by_path[e["path"]] = e;
  auto rel = [&](const fs::path& p) { return fs::relative(p, cache).string(); };
  CHECK(by_path[rel(pending)]["state"] == "pending");
  CHECK(by_path[rel(failed)]["state"] == "failed");
  CHECK(by_path[rel(done)]["state"] == "done");
  CHECK(by_path[rel(stale)]["state"] == "stale");
  CHECK(by_path[rel(done)]["neff_bytes"] == 1000);
  CHECK(by_path[rel(pending)]["bytes"] == fs::file_size(pending / fs::path("model.hlo_module.pb")) +
                                               fs::file_size(pending / fs::path("compile_flags.json")));
  CHECK(by_path[rel(pending)]["compile_seconds"].is_null());

  r = tool({"ls", "--cache", cache.string(), "--json", "--state", "done"});
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.output).size() == 1);
  r = tool({"ls", "--cache", cache.string()});
  CHECK(r.output.find("failed") != std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 5);  // a header and four entries
  CHECK(tool({"ls", "--cache", cache.string(), "--state", "bogus"}).exit_code == 2);

  r = tool({"scan", "--cache", cache.string()});
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("INFO ||NEURON_CACHE||: Current remaining items are 2, locked are 0, failed are 1, done are 1, "
                      "total is 4\n") != std::string::npos);
  r = tool({"scan", "--cache", cache.string(), "--with-failed", "--json"});
  auto j = nlohmann::json::parse(r.output);
  CHECK(j["remaining"] == 3);
  CHECK(j["failed"] == 0);
  CHECK(j["states"]["stale"] == 1);
  test::check_one_line_error(tool({"scan", "--cache", (dir / "missing").string()}), "missing");
}

TEST_CASE("neffcache compile and neuron_parallel_compile compile only the entries of their compiler's folder", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  auto ours = put(cache, "gopjrt_tuple.hlo.pb");  // neuronxcc-2.21.0, the fake's
  auto put_as = [&](const std::string& version, const std::string& file) {
    auto r = tool({"put", "--cache", cache.string(), "--compiler-version", version, (test::k_corpus / file).string()});
    REQUIRE(r.exit_code == 0);
    return fs::path(r.output.substr(0, r.output.size() - 1));
  };
  // The same SDK's full version is another folder, as is an older SDK's.
  std::vector<fs::path> theirs{put_as("2.21.0.0+b0d7f0f4", "gopjrt_x_squared.hlo.pb"),
                               put_as("2.20.0", "rocm08_normal_9.hlo_proto.pb"),
                               put_as("2.20.0", "spu_jax_cnn.hlo.pb")};
  const auto log = dir / "compiles.log";
  auto skipped = [](const std::string& output) {
    int n = 0;
    for (auto at = output.find("is skipped"); at != std::string::npos; at = output.find("is skipped", at + 1)) ++n;
    return n;
  };
  auto r = tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template, "--json"},
                {"NEFFCACHE_FAKE_LOG=" + log.string()});
  CHECK(r.exit_code == 0);  // skipped entries are not failures
  auto report = last_json(r.output);
  CHECK(report["compilation_summary"]["true"] == 1);
  CHECK(report["compilation_report"].size() == 1);
  CHECK(test::count_lines(log) == 1);
  CHECK(fs::exists(ours / "model.done"));
  // One line per other folder, naming both versions.
  CHECK(r.output.find("its folder is for compiler 2.20.0, and '" + k_fake + "' reports 2.21.0 (every entry of "
                      "neuronxcc-2.20.0 is skipped)") != std::string::npos);
  CHECK(r.output.find("its folder is for compiler 2.21.0.0+b0d7f0f4, and '" + k_fake + "' reports 2.21.0") !=
        std::string::npos);
  CHECK(skipped(r.output) == 2);
  for (const auto& e : theirs) CHECK(fs::directory_iterator(e)->path().filename() == "model.hlo_module.pb");
  // neuron_parallel_compile's compile step: the same.
  r = test::run({"env", "NEURON_COMPILE_CACHE_URL=" + cache.string(), "NEFFCACHE_FAKE_LOG=" + log.string(),
                 test::path::npc, "--command", "compile", "--compiler", k_fake_template});
  CHECK(r.exit_code == 0);
  CHECK(skipped(r.output) == 2);
  CHECK(test::count_lines(log) == 1);
  for (const auto& e : theirs) CHECK(!fs::exists(e / "model.neff"));
}

TEST_CASE("neffcache compile: parallel, the Neuron report, exit status = failed graphs", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  std::vector<fs::path> entries{put(cache, "gopjrt_tuple.hlo.pb"), put(cache, "gopjrt_x_squared.hlo.pb"),
                                put(cache, "rocm08_normal_9.hlo_proto.pb")};
  const std::string bad = entries[1].filename().string().substr(7, 20);  // its graph hash
  const auto log = dir / "compiles.log";
  std::vector<std::string> env{"NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_ONLY=" + bad, "NEFFCACHE_FAKE_LOG=" + log.string()};
  auto r = tool({"compile", "--cache", cache.string(), "-j", "2", "--compiler", k_fake_template, "--json"}, env);
  CHECK(r.exit_code == 1);  // one graph failed
  auto report = last_json(r.output);
  CHECK(report["compilation_summary"]["true"] == 2);
  CHECK(report["compilation_summary"]["false"] == 1);
  REQUIRE(report["compilation_report"].size() == 3);
  for (const auto& e : entries) {
    auto item = report["compilation_report"][(e / "model.hlo_module.pb").string()];
    CHECK(item["status"] == (e != entries[1]));
    CHECK(item["retry"] == 0);
    CHECK(item["compile_time"].is_number());
  }
  CHECK(report["start_time"].get<double>() > 1.7e9);
  CHECK(report["compilation_time"].get<double>() > 0);
  CHECK(r.output.find("INFO ||NEURON_CACHE||: Current remaining items are 0, locked are 0, failed are 1, done are 2, "
                      "total is 3") != std::string::npos);
  CHECK(fake::parse_fake_neff(test::slurp(entries[0] / "model.neff")).has_value());
  CHECK(fs::exists(entries[1] / "model.log"));
  CHECK(test::count_lines(log) == 3);
  auto listed = nlohmann::json::parse(tool({"ls", "--cache", cache.string(), "--json", "--state", "done"}).output);
  REQUIRE(listed.size() == 2);
  CHECK(listed[0]["compile_seconds"].is_number());

  // Nothing left to do: the failure stays recorded, and nothing compiles.
  r = tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template}, env);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("Total graphs: 0") != std::string::npos);
  CHECK(test::count_lines(log) == 3);
  // --retry-failed compiles it again (and it fails again, the compiler unchanged)...
  r = tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template, "--retry-failed"}, env);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("INFO ||NEURON_PARALLEL_COMPILE||: Total failed compilations: 1") != std::string::npos);
  CHECK(test::count_lines(log) == 4);
  // ...and named, with a fixed compiler, it compiles.
  r = tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template, "--retry-failed",
            fs::relative(entries[1], cache).string()},
           {"NEFFCACHE_FAKE_LOG=" + log.string()});
  CHECK(r.exit_code == 0);
  CHECK(fs::exists(entries[1] / "model.done"));
  CHECK(test::count_lines(log) == 5);

  test::check_one_line_error(tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template, "MODULE_nothing"}),
                       "not a cache entry");
  test::check_one_line_error(tool({"compile", "--cache", cache.string(), "--compiler", "no-such-cc {hlo} {neff}"}),
                       "not found on PATH");
}

TEST_CASE("neffcache retry clears recorded failures, named or all", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  auto a = put(cache, "gopjrt_tuple.hlo.pb");
  auto b = put(cache, "gopjrt_x_squared.hlo.pb");
  test::spit(a / fs::path("model.log"), "error");
  test::spit(b / fs::path("model.log"), "error");
  CHECK(tool({"retry", "--cache", cache.string()}).exit_code == 2);  // neither entries nor --all
  auto r = tool({"retry", "--cache", cache.string(), a.filename().string()});  // a bare MODULE_ name does not resolve...
  test::check_one_line_error(r, "not a cache entry");
  r = tool({"retry", "--cache", cache.string(), (a / "model.hlo_module.pb").string()});  // ...a file in the entry does
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(a / fs::path("model.log")));
  CHECK(fs::exists(b / fs::path("model.log")));
  r = tool({"retry", "--cache", cache.string(), "--all"});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find(b.string()) != std::string::npos);
  CHECK_FALSE(fs::exists(b / fs::path("model.log")));
  CHECK(nlohmann::json::parse(tool({"scan", "--cache", cache.string(), "--json"}).output)["remaining"] == 2);
}

TEST_CASE("neffcache clear-locks removes stale locks and leaves a live one alone", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  auto live = put(cache, "gopjrt_tuple.hlo.pb");
  auto stale = put(cache, "gopjrt_x_squared.hlo.pb");
  auto held = EntryLock::try_acquire((live / fs::path("model.hlo_module.pb.lock")).string());  // a compile in progress
  REQUIRE(held.has_value());
  const auto stale_lock = stale / fs::path("model.hlo_module.pb.lock");
  test::spit(stale_lock, "");  // a Neuron client's lock, left by a crash hours ago
  fs::last_write_time(stale_lock, fs::file_time_type::clock::now() - std::chrono::hours(3));
  auto r = tool({"clear-locks", "--cache", cache.string()});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(stale_lock));
  CHECK(fs::exists(live / fs::path("model.hlo_module.pb.lock")));
  CHECK(held->heartbeat().has_value());  // still ours
  CHECK(r.output.find("left " + fs::relative(live, cache).string() + " alone") != std::string::npos);
  CHECK(r.output.find("1 stale lock removed, 1 live lock left alone") != std::string::npos);
}

TEST_CASE("neffcache clean and clear-neffs spare entries being compiled", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  auto done = put(cache, "gopjrt_tuple.hlo.pb");
  auto failed = put(cache, "gopjrt_x_squared.hlo.pb");
  auto busy = put(cache, "rocm08_normal_9.hlo_proto.pb");
  test::spit(done / fs::path("model.neff"), "neff");
  test::spit(done / fs::path("model.done"), "");
  test::spit(failed / fs::path("model.log"), "error");
  test::spit(busy / fs::path("model.neff"), "neff");
  test::spit(busy / fs::path("model.done"), "");
  auto held = EntryLock::try_acquire((busy / fs::path("model.hlo_module.pb.lock")).string());
  REQUIRE(held.has_value());

  auto r = tool({"clear-neffs", "--cache", cache.string()});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("2 entries are pending again, 1 left alone") != std::string::npos);
  CHECK_FALSE(fs::exists(done / fs::path("model.neff")));
  CHECK_FALSE(fs::exists(done / fs::path("model.done")));
  CHECK_FALSE(fs::exists(failed / fs::path("model.log")));
  CHECK(fs::exists(done / fs::path("model.hlo_module.pb")));
  CHECK(fs::exists(busy / fs::path("model.neff")));

  // Without --yes (and no terminal to ask on) nothing is removed.
  test::check_one_line_error(tool({"clean", "--cache", cache.string()}), "--yes");
  CHECK(fs::exists(done));
  r = tool({"clean", "--cache", cache.string(), "--yes"});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(done));
  CHECK_FALSE(fs::exists(failed));
  CHECK(fs::exists(busy / fs::path("model.neff")));  // compiling: left alone
  CHECK(r.output.find("2 entries removed") != std::string::npos);
  held->release();
  CHECK(tool({"clean", "--cache", cache.string(), "--yes"}).exit_code == 0);
  CHECK(fs::is_empty(cache));  // the compiler folder went with its last entry
}

namespace {

// Marks an entry done, its NEFF last read `hours_ago`.
void make_done(const fs::path& entry, int hours_ago, std::size_t neff_bytes = 1000) {
  test::spit(entry / "model.neff", std::string(neff_bytes, 'n'));
  test::spit(entry / "model.done", "");
  struct timespec t[2];
  t[0].tv_sec = t[1].tv_sec = ::time(nullptr) - hours_ago * 3600;
  t[0].tv_nsec = t[1].tv_nsec = 0;
  REQUIRE(::utimensat(AT_FDCWD, (entry / "model.neff").c_str(), t, 0) == 0);
}

}  // namespace

TEST_CASE("neffcache gc keeps the most recently used entries within the limit", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  const auto corpus = test::corpus_files();
  std::vector<fs::path> done;
  for (int i = 0; i < 4; ++i) {
    done.push_back(put(cache, corpus[static_cast<std::size_t>(i)].filename().string()));
    make_done(done.back(), 40 - 10 * i);  // done[3] is the most recently used
  }
  auto pending = put(cache, corpus[4].filename().string());
  auto bytes = [&] {
    std::map<std::string, uint64_t> out;
    for (auto& e : nlohmann::json::parse(tool({"ls", "--cache", cache.string(), "--json"}).output))
      out[(cache / e["path"].get<std::string>()).string()] = e["bytes"];
    return out;
  };
  auto before = bytes();
  const uint64_t limit = before[done[2].string()] + before[done[3].string()] + before[pending.string()];

  auto r = tool({"gc", "--cache", cache.string(), "--max-size", std::to_string(limit), "--dry-run"});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("would remove " + fs::relative(done[0], cache).string()) != std::string::npos);
  CHECK(fs::exists(done[0]));  // a dry run removes nothing

  r = tool({"gc", "--cache", cache.string(), "--max-size", std::to_string(limit)});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(done[0]));
  CHECK_FALSE(fs::exists(done[1]));
  CHECK(fs::exists(done[2] / "model.neff"));
  CHECK(fs::exists(done[3] / "model.neff"));
  CHECK(fs::exists(pending));  // never evicted by size: it is not done
  uint64_t left = 0;
  for (auto& [path, b] : bytes()) left += b;
  CHECK(left <= limit);

  SECTION("--keep-compilers drops the trees of older compilers") {
    auto r2 = tool({"put", "--cache", cache.string(), "--compiler-version", "2.19.0",
                    (test::k_corpus / "gopjrt_tuple.hlo.pb").string()});
    REQUIRE(r2.exit_code == 0);
    fs::path old_entry = r2.output.substr(0, r2.output.size() - 1);
    make_done(old_entry, 1000);
    r2 = tool({"gc", "--cache", cache.string(), "--max-size", "1T", "--keep-compilers", "1"});
    CHECK(r2.exit_code == 0);
    CHECK_FALSE(fs::exists(cache / "neuronxcc-2.19.0"));
    CHECK(fs::exists(done[3]));
  }
  test::check_one_line_error(tool({"gc", "--cache", cache.string(), "--max-size", "lots"}), "--max-size");
}

TEST_CASE("neffcache verify finds a damaged NEFF and --repair makes it pending", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  auto a = put(cache, "gopjrt_tuple.hlo.pb");
  auto b = put(cache, "rocm08_normal_9.hlo_proto.pb");
  REQUIRE(tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template}).exit_code == 0);
  auto r = tool({"verify", "--cache", cache.string()});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("2 checked, 0 broken") != std::string::npos);

  // One byte flipped in place, same size: only the checksum can tell.
  std::string neff = test::slurp(b / "model.neff");
  neff[neff.size() / 2] ^= 1;
  write_file_in_place(b / "model.neff", neff);
  r = tool({"verify", "--cache", cache.string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("broken " + fs::relative(b, cache).string() + ": model.neff has checksum") != std::string::npos);
  r = tool({"verify", "--cache", cache.string(), "--repair"});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(b / "model.neff"));
  CHECK(fs::exists(a / "model.neff"));
  CHECK(nlohmann::json::parse(tool({"scan", "--cache", cache.string(), "--json"}).output)["remaining"] == 1);
}

TEST_CASE("neffcache stats counts a plain cache", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  make_done(put(cache, "gopjrt_tuple.hlo.pb"), 1, 5000);
  put(cache, "rocm08_normal_9.hlo_proto.pb");
  auto r = tool({"stats", "--cache", cache.string(), "--json"});
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.output);
  CHECK(j["entries"] == 2);
  CHECK(j["states"]["done"] == 1);
  CHECK(j["states"]["pending"] == 1);
  CHECK(j["neff_bytes"] == 5000);
  CHECK_FALSE(j.contains("daemon"));
  CHECK(tool({"stats", "--cache", cache.string()}).output.find("2 (1 pending, 0 compiling, 1 done") != std::string::npos);
}

TEST_CASE("neffcache analyze writes opcode histograms per graph and per cache", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  const auto tf = put(cache, "spu_tf_jit_comp.hlo.pb");
  const auto jax = put(cache, "spu_jax_cnn.hlo.pb");
  make_done(put(cache, "gopjrt_tuple.hlo.pb"), 1, 100);
  auto r = tool({"analyze", "--cache", cache.string(), "--output", (dir / "out").string()});
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("3 graphs") != std::string::npos);
  auto j = nlohmann::json::parse(test::slurp(dir / "out" / "result.json"));
  CHECK(j["verbosity"] == 2);
  REQUIRE(j["graphs"].size() == 3);
  // Each graph agrees with hlo-stats of its file; the cache total is their sum.
  std::map<std::string, uint64_t> sum;
  uint64_t instructions = 0;
  for (const auto& [path, g] : j["graphs"].items()) {
    auto alone = nlohmann::json::parse(tool({"hlo-stats", "--json", path}).output);
    CHECK(g["opcodes"] == alone["opcodes"]);
    CHECK(g["framework_ops"] == alone["framework_ops"]);
    CHECK(g["instructions"] == alone["instructions"]);
    instructions += g["instructions"].get<uint64_t>();
    for (const auto& [op, n] : g["opcodes"].items()) sum[op] += n.get<uint64_t>();
  }
  CHECK(j["total"]["graphs"] == 3);
  CHECK(j["total"]["instructions"] == instructions);
  CHECK(j["total"]["opcodes"] == nlohmann::json(sum));
  const auto tf_graph = j["graphs"][(tf / "model.hlo_module.pb").string()];
  CHECK(tf_graph["state"] == "pending");
  CHECK(tf_graph["framework_ops"]["LessEqual"] == 2);  // TensorFlow ops behind the HLO
  CHECK(j["graphs"].contains((jax / "model.hlo_module.pb").string()));

  // Named entries only, verbosity 1: no framework operators.
  r = tool({"analyze", "--cache", cache.string(), "--output", (dir / "one").string(), "--verbosity", "1", tf.string()});
  REQUIRE(r.exit_code == 0);
  j = nlohmann::json::parse(test::slurp(dir / "one" / "result.json"));
  CHECK(j["graphs"].size() == 1);
  CHECK_FALSE(j["total"].contains("framework_ops"));

  // A graph that is not HLO: listed as unreadable, the others still analyzed, exit 1.
  test::spit(tf / "model.hlo_module.pb", "not an hlo module");
  r = tool({"analyze", "--cache", cache.string(), "--output", (dir / "out").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find(fmt::format("neffcache: error: {}/model.hlo_module.pb: not a readable HLO module", tf.string())) !=
        std::string::npos);
  j = nlohmann::json::parse(test::slurp(dir / "out" / "result.json"));
  CHECK(j["graphs"].size() == 2);
  CHECK(j["unreadable"].size() == 1);
  CHECK(tool({"analyze", "--cache", cache.string(), "--verbosity", "3"}).exit_code == 2);
  test::check_one_line_error(tool({"analyze", "--cache", cache.string(), (dir / "nope").string()}), "not a cache entry");
  test::check_one_line_error(
      tool({"analyze", "--cache", cache.string(), "--output", (dir / "out" / "result.json").string()}),
      "cannot create the output directory");
}

TEST_CASE("commands that need no compiler work without one, and scan says which compiler folders it counts", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  const auto no_compiler = dir / "empty-bin", with_fake = dir / "bin";
  fs::create_directories(no_compiler);
  fs::create_directories(with_fake);
  fs::create_symlink(k_fake, with_fake / "neuronx-cc");  // reports version 2.21.0 (NEFFCACHE_FAKE_VERSION)
  auto put_as = [&](const std::string& version, const std::string& file) {
    auto r = tool({"put", "--cache", cache.string(), "--compiler-version", version, (test::k_corpus / file).string()});
    REQUIRE(r.exit_code == 0);
    return fs::path(r.output.substr(0, r.output.size() - 1));
  };
  put_as("2.21.0", "gopjrt_tuple.hlo.pb");
  put_as("2.21.0", "rocm08_normal_9.hlo_proto.pb");
  auto old = put_as("2.19.0", "spu_jax_cnn.hlo.pb");
  test::spit(old / "model.log", "error");
  auto on_path = [&](const fs::path& bin, const std::string& program, std::vector<std::string> args) {
    std::vector<std::string> argv{"env", "-u", "NEURON_CC_FLAGS", "PATH=" + bin.string(),
                                  "NEURON_COMPILE_CACHE_URL=" + cache.string(), program};
    argv.insert(argv.end(), args.begin(), args.end());
    return test::run(argv);
  };

  // No neuronx-cc at all: every compiler folder is counted, and named.
  auto r = on_path(no_compiler, test::k_tool, {"scan"});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("Counting neuronxcc-2.19.0, neuronxcc-2.21.0 (every compiler folder; compiler "
                      "'neuronx-cc' not found on PATH)") != std::string::npos);
  CHECK(r.output.find("remaining items are 2, locked are 0, failed are 1, done are 0, total is 3") != std::string::npos);
  r = on_path(no_compiler, test::path::npc, {"--command", "scan"});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("total is 3") != std::string::npos);
  // With the compiler: only its folder.
  r = on_path(with_fake, test::k_tool, {"scan", "--json"});
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.output);
  CHECK(j["compiler_dirs"] == nlohmann::json::array({"neuronxcc-2.21.0"}));
  CHECK(j["total"] == 2);
  r = on_path(with_fake, test::path::npc, {"--command", "scan-with-failed"});
  CHECK(r.output.find("Counting neuronxcc-2.21.0 (the folder of 'neuronx-cc' 2.21.0)") != std::string::npos);

  // The rest of the commands on a cache need no compiler either.
  for (std::vector<std::string> args :
       {std::vector<std::string>{"ls"}, {"stats"}, {"verify"}, {"clear-locks"}, {"retry", "--all"},
        {"analyze", "--output", (dir / "analysis").string()}, {"gc", "--max-size", "1T"}, {"clean", "--yes"}}) {
    r = on_path(no_compiler, test::k_tool, args);
    INFO(args[0] << ": " << r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("not found on PATH") == std::string::npos);
  }
  CHECK(fs::is_empty(cache));
  test::check_one_line_error(on_path(no_compiler, test::path::npc, {"--command", "compile"}), "not found on PATH",
                             "neffcache");
}

TEST_CASE("neffcache compile gives twins the NEFF of an equal graph; ls, stats and index show it", "[cli][index]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  const auto log = dir / "compiles.log";
  const std::vector<std::string> env{"NEFFCACHE_FAKE_LOG=" + log.string()};
  auto a = put(cache, "spu_jax_cnn.hlo.pb");
  REQUIRE(tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template}, env).exit_code == 0);
  REQUIRE(test::count_lines(log) == 1);

  // The same graph under another name, as a moved script or XLA_HLO_DEBUG would write it.
  auto b = cache / "neuronxcc-2.21.0" / "MODULE_twin";
  fs::create_directories(b);
  test::spit(b / "model.hlo_module.pb", test::debug_variant(test::slurp(test::k_corpus / "spu_jax_cnn.hlo.pb")));
  fs::copy_file(a / "compile_flags.json", b / "compile_flags.json");
  auto r = tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template}, env);
  CHECK(r.exit_code == 0);
  CHECK(test::count_lines(log) == 1);  // no compile
  CHECK(test::slurp(b / "model.neff") == test::slurp(a / "model.neff"));

  auto listed = nlohmann::json::parse(tool({"ls", "--cache", cache.string(), "--json"}).output);
  REQUIRE(listed.size() == 2);
  CHECK(listed[1]["path"] == "neuronxcc-2.21.0/MODULE_twin");
  CHECK(listed[1]["copied_from"] == fmt::format("neuronxcc-2.21.0/{}", a.filename().string()));
  CHECK(tool({"ls", "--cache", cache.string()}).output.find("(copy of neuronxcc-2.21.0/MODULE_") != std::string::npos);
  auto stats = nlohmann::json::parse(tool({"stats", "--cache", cache.string(), "--json"}).output);
  CHECK(stats["twins"] == 1);
  CHECK(stats["twin_seconds_saved"].get<double>() > 0);

  r = tool({"index", "--cache", cache.string(), "--rebuild"});
  CHECK(r.exit_code == 0);
  CHECK(r.output == "2 done or failed entries, 2 recorded now\n");
  r = tool({"index", "--cache", (dir / "nowhere").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("no such cache folder") != std::string::npos);
}
