// neffcache's maintenance commands on an s3:// cache: put, verify, retry, clear-locks,
// clear-neffs, gc and clean, each change under the entry's lease.
#include <sys/stat.h>

#include <chrono>
#include <map>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/hlo/hlo.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/lease.hpp>

#include <neffcache/cache/lnl.hpp>

#include "lnl.hpp"
#include "nki.hpp"
#include "s3_support.hpp"
#include "support.hpp"

using namespace s3test;  // the library, chrono literals, ContainsSubstring, fs, k_fake_template

namespace {

test::ToolRun tool(std::vector<std::string> args) {
  return test::run(test::s3_tool_argv(args, {"NEFFCACHE_FAKE_RATE=0"}));
}

// Puts corpus graph `i` into the cache; returns the entry's path in the cache.
std::string put(const std::string& url, int i) {
  auto r = tool({"put", "--cache", url, "--compiler-version", "2.21.0", "--json",
                 test::corpus_files()[static_cast<std::size_t>(i)].string()});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.output);
  CHECK(j["created"] == true);
  CHECK(j["path"] == url + "/" + j["key"].get<std::string>());
  return j["key"];
}

std::set<std::string> names_in(S3Client& s3, const std::string& base) {
  auto l = s3.list(base + "/");
  REQUIRE(l.has_value());
  std::set<std::string> out;
  for (const auto& o : l->objects) out.insert(o.key.substr(base.size() + 1));
  return out;
}

}  // namespace

TEST_CASE("neffcache maintenance commands work on an s3:// cache", "[s3][maintenance]") {
  auto s3 = test::fresh_bucket("maint");
  const std::string url = fmt::format("s3://{}/p", s3->bucket());
  std::vector<std::string> rels;
  for (int i = 0; i < 4; ++i) rels.push_back(put(url, i));
  auto key = [&](int i) { return "p/" + rels[static_cast<std::size_t>(i)]; };
  CHECK(names_in(*s3, key(0)) == std::set<std::string>{"compile_flags.json", "model.hlo_module.pb"});
  // A second put of the same graph creates nothing.
  auto again = tool({"put", "--cache", url, "--compiler-version", "2.21.0", "--json", test::corpus_files()[0].string()});
  CHECK(nlohmann::json::parse(again.output)["created"] == false);

  auto compiled = tool({"compile", "--cache", url, "--compiler", k_fake_template});
  INFO(compiled.output);
  REQUIRE(compiled.exit_code == 0);
  CHECK_THAT(tool({"verify", "--cache", url}).output, ContainsSubstring("4 checked, 0 broken"));

  SECTION("verify finds a done entry without its NEFF and repairs it") {
    REQUIRE(s3->remove(key(1) + "/model.neff").has_value());
    auto v = tool({"verify", "--cache", url});
    CHECK(v.exit_code == 1);
    CHECK_THAT(v.output, ContainsSubstring("model.done without model.neff"));
    CHECK(tool({"verify", "--cache", url, "--repair"}).exit_code == 0);
    CHECK(names_in(*s3, key(1)) == std::set<std::string>{"compile_flags.json", "model.hlo_module.pb"});
  }
  SECTION("retry clears recorded failures") {
    REQUIRE(tool({"clear-neffs", "--cache", url}).exit_code == 0);
    REQUIRE(s3->put(key(2) + "/model.log", "error: boom\n").has_value());
    auto r = tool({"retry", "--cache", url, "--all"});
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, ContainsSubstring(url + "/" + rels[2]));
    CHECK_FALSE(names_in(*s3, key(2)).contains("model.log"));
    auto named = tool({"retry", "--cache", url, "not/an/entry"});
    test::check_one_line_error(named, "not an entry");
  }
  SECTION("clear-neffs makes every entry pending again") {
    auto r = tool({"clear-neffs", "--cache", url});
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, ContainsSubstring("4 entries are pending again"));
    for (int i = 0; i < 4; ++i) CHECK(names_in(*s3, key(i)).size() == 2);
  }
  SECTION("clear-locks removes expired leases and leaves live ones") {
    REQUIRE(tool({"clear-neffs", "--cache", url}).exit_code == 0);
    auto dead = S3Lease::acquire(*s3, key(0) + "/model.hlo_module.pb.lock", 1s, "dead-host");
    auto live = S3Lease::acquire(*s3, key(1) + "/model.hlo_module.pb.lock", 60s, "live-host");
    REQUIRE(dead.has_value());
    REQUIRE(live.has_value());
    std::this_thread::sleep_for(2500ms);
    auto r = tool({"clear-locks", "--cache", url});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, ContainsSubstring("dead-host"));
    CHECK_THAT(r.output, ContainsSubstring("live-host"));
    CHECK_THAT(r.output, ContainsSubstring("1 stale lock removed, 1 live lock left alone"));
    CHECK_FALSE(names_in(*s3, key(0)).contains("model.hlo_module.pb.lock"));
    CHECK(names_in(*s3, key(1)).contains("model.hlo_module.pb.lock"));
  }
  SECTION("gc evicts done entries to fit; clean removes all but a leased one") {
    auto gc = tool({"gc", "--cache", url, "--max-size", "0"});
    CHECK(gc.exit_code == 0);
    CHECK_THAT(gc.output, ContainsSubstring("removed 4 entries"));
    for (int i = 0; i < 4; ++i) CHECK(names_in(*s3, key(i)).empty());
    for (int i = 0; i < 3; ++i) put(url, i);
    auto live = S3Lease::acquire(*s3, key(1) + "/model.hlo_module.pb.lock", 60s, "live-host");
    REQUIRE(live.has_value());
    auto clean = tool({"clean", "--cache", url, "--yes"});
    INFO(clean.output);
    CHECK(clean.exit_code == 0);
    CHECK_THAT(clean.output, ContainsSubstring("2 entries removed"));
    CHECK(names_in(*s3, key(0)).empty());
    CHECK(names_in(*s3, key(1)).size() == 3);  // left alone: being compiled elsewhere
  }
}

TEST_CASE("neffcache analyze reads the graphs of an s3:// cache", "[s3][maintenance]") {
  auto s3 = test::fresh_bucket("analyze");
  const std::string url = fmt::format("s3://{}/p", s3->bucket());
  const std::string a = put(url, 0), b = put(url, 1);
  test::TempDir dir;
  auto r = tool({"analyze", "--cache", url, "--output", (dir / "out").string()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  auto result = nlohmann::json::parse(test::slurp(dir / "out" / "result.json"));
  CHECK(result["cache"] == url);
  CHECK(result["total"]["graphs"] == 2);
  uint64_t expected = 0;
  for (int i : {0, 1}) expected += analyze_hlo_file(test::corpus_files()[static_cast<std::size_t>(i)].string())->stats.instructions;
  CHECK(result["total"]["instructions"] == expected);
  CHECK(result["graphs"].contains(url + "/" + a + "/model.hlo_module.pb"));
  CHECK(result["graphs"][url + "/" + a + "/model.hlo_module.pb"]["state"] == "pending");

  // One entry by its path in the cache; a name that is not an entry is refused.
  r = tool({"analyze", "--cache", url, "--output", (dir / "one").string(), b});
  CHECK(r.exit_code == 0);
  CHECK(nlohmann::json::parse(test::slurp(dir / "one" / "result.json"))["total"]["graphs"] == 1);
  test::check_one_line_error(tool({"analyze", "--cache", url, "--output", (dir / "x").string(), "MODULE_nope"}),
                             "not an entry of");
}

TEST_CASE("neffcache commands on LNL entries of an s3:// cache: ls, compile under the lease, verify, retry, sync",
          "[s3][maintenance][lnl]") {
  auto s3 = test::fresh_bucket("lnlcmds");
  const std::string url = fmt::format("s3://{}/v", s3->bucket());
  const std::string pending = test::lnl_key("s3 pending"), failed = test::lnl_key("s3 failed");
  test::TempDir dir;
  for (const auto& [key, corpus] : {std::pair{pending, "spu_tf_jit_comp.hlo.pb"}, {failed, "gopjrt_tuple.hlo.pb"}}) {
    auto folder = test::make_lnl_entry(dir / "src", corpus, key, {"-O2"});
    for (const char* f : {"command.txt", ".artifact_metadata_v0.json", "graph.hlo"})
      REQUIRE(s3->upload("v/" + key + "/" + f, (folder / f).string()).has_value());
  }
  REQUIRE(s3->put("v/" + failed + "/.neffcache-failed.log", "error: boom\n").has_value());

  auto ls = tool({"ls", "--cache", url, "--json"});
  INFO(ls.output);
  REQUIRE(ls.exit_code == 0);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : nlohmann::json::parse(ls.output)) rows[row["path"].get<std::string>()] = row;
  REQUIRE(rows.size() == 2);
  CHECK(rows[pending]["dialect"] == "lnl");
  CHECK(rows[pending]["state"] == "pending");
  CHECK(rows[failed]["state"] == "failed");

  // compile: the pending entry, under its lease, with its own arguments; LNL's marker last.
  auto compiled = tool({"compile", "--cache", url, "--compiler", k_fake_template});
  INFO(compiled.output);
  REQUIRE(compiled.exit_code == 0);
  const std::string base = "v/" + pending;
  CHECK(names_in(*s3, base) == std::set<std::string>{"command.txt", ".artifact_metadata_v0.json", "graph.hlo",
                                                      lnl_neff_name(pending), "log-neuron-cc.txt",
                                                      ".compilation_complete", ".neffcache-meta.json"});
  const std::string neff = s3->get(base + "/" + lnl_neff_name(pending)).value();
  CHECK(lnl_marker_neff_size(s3->get(base + "/.compilation_complete").value()) == neff.size());
  CHECK_THAT(tool({"verify", "--cache", url}).output, ContainsSubstring("1 checked, 0 broken"));
  // A NEFF of another size than its marker says is broken.
  REQUIRE(s3->put(base + "/" + lnl_neff_name(pending), neff + "junk").has_value());
  auto broken = tool({"verify", "--cache", url});
  CHECK(broken.exit_code == 1);
  CHECK_THAT(broken.output, ContainsSubstring("its marker says " + std::to_string(neff.size())));
  REQUIRE(s3->put(base + "/" + lnl_neff_name(pending), neff).has_value());

  // retry forgets our failure record; the entry is pending again and compiles.
  auto retried = tool({"retry", "--cache", url, url + "/" + failed});
  INFO(retried.output);
  CHECK(retried.exit_code == 0);
  CHECK_FALSE(names_in(*s3, "v/" + failed).contains(".neffcache-failed.log"));
  REQUIRE(tool({"compile", "--cache", url, "--compiler", k_fake_template}).exit_code == 0);
  CHECK(names_in(*s3, "v/" + failed).contains(".compilation_complete"));

  // sync pull brings both entries whole (marker after the NEFF); push takes a local one up.
  auto pulled = tool({"sync", "pull", (dir / "pulled").string(), url});
  INFO(pulled.output);
  REQUIRE(pulled.exit_code == 0);
  CHECK(test::slurp(dir / "pulled" / pending / lnl_neff_name(pending)) == neff);
  CHECK(fs::exists(dir / "pulled" / pending / ".compilation_complete"));
  CHECK(fs::exists(dir / "pulled" / failed / ".compilation_complete"));
  const std::string other = test::lnl_key("pushed");
  test::make_lnl_entry(dir / "local", "gopjrt_jax_xp1.hlo.pb", other);
  test::spit(dir / "local" / other / lnl_neff_name(other), "a NEFF");
  test::spit(dir / "local" / other / ".compilation_complete", lnl_marker(1, 6));
  REQUIRE(tool({"sync", "push", (dir / "local").string(), url}).exit_code == 0);
  CHECK(s3->get("v/" + other + "/" + lnl_neff_name(other)).value() == "a NEFF");
  CHECK(s3->head("v/" + other + "/.compilation_complete").has_value());

  // clear-neffs keeps the inputs: the entries are pending again.
  REQUIRE(tool({"clear-neffs", "--cache", url}).exit_code == 0);
  CHECK(names_in(*s3, base) == std::set<std::string>{"command.txt", ".artifact_metadata_v0.json", "graph.hlo"});
}

TEST_CASE("sync carries NKI kernels and LNL's nki/ results; a compile on S3 fetches a kernel this host lacks",
          "[s3][maintenance][lnl][nki]") {
  auto s3 = test::fresh_bucket("nkisync");
  const std::string url = fmt::format("s3://{}/v", s3->bucket());
  test::TempDir dir;
  const fs::path kernels = dir / "nki-intermediate-cache";
  const fs::path kernel = kernels / "ab" / "k1.klir", absent = kernels / "absent.klir";
  test::spit(kernel, "kernel one");
  const std::string calls = test::lnl_key("calls k1"), calls_absent = test::lnl_key("calls an absent kernel");
  for (const auto& [key, k] : {std::pair{calls, kernel}, {calls_absent, absent}}) {
    test::make_lnl_entry(dir / "local", "gopjrt_tuple.hlo.pb", key, {"-O1"});
    test::spit(dir / "local" / key / "graph.hlo", test::graph_calling(k.string()));
  }
  test::spit(dir / "local" / "nki" / "0123.json", R"({"neff": "k1"})");

  // push: the kernel and the nki/ result go up; a kernel not on this host is a warning,
  // and the entry calling it still goes (it compiles only where the kernel is).
  auto pushed = tool({"sync", "push", (dir / "local").string(), url, "--nki-kernels", kernels.string()});
  INFO(pushed.output);
  REQUIRE(pushed.exit_code == 0);
  CHECK_THAT(pushed.output, ContainsSubstring("warning: the NKI kernel " + absent.string() + " is not on this host"));
  CHECK(s3->get("v/.neffcache/nki-kernels/ab/k1.klir").value() == "kernel one");
  CHECK(s3->get("v/nki/0123.json").value() == R"({"neff": "k1"})");
  CHECK_FALSE(s3->head("v/.neffcache/nki-kernels/absent.klir").has_value());
  for (const auto& key : {calls, calls_absent}) CHECK(s3->head("v/" + key + "/graph.hlo").has_value());
  // nki/ is no entry of the bucket.
  auto ls = tool({"ls", "--cache", url, "--json"});
  REQUIRE(ls.exit_code == 0);
  CHECK(nlohmann::json::parse(ls.output).size() == 2);
  // Again: nothing new to copy.
  auto again = tool({"sync", "push", (dir / "local").string(), url, "--nki-kernels", kernels.string()});
  CHECK(again.exit_code == 0);
  CHECK_THAT(again.output, ContainsSubstring(" 0 files copied"));

  // pull on a host without the kernel: the kernel comes back to its path, nki/ too.
  fs::remove_all(kernels);
  auto pulled = tool({"sync", "pull", (dir / "pulled").string(), url, "--nki-kernels", kernels.string()});
  INFO(pulled.output);
  REQUIRE(pulled.exit_code == 0);
  CHECK(test::slurp(kernel) == "kernel one");
  CHECK(test::slurp(dir / "pulled" / "nki" / "0123.json") == R"({"neff": "k1"})");
  CHECK(fs::exists(dir / "pulled" / calls / "graph.hlo"));

  // compile of the bucket on a host without the kernel: fetched, then compiled; the
  // entry calling a kernel that no host has is refused by name, and not recorded.
  fs::remove_all(kernels);
  auto compiled = test::run(test::s3_tool_argv({"compile", "--cache", url, "--compiler", k_fake_template},
                                               {"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_NKI_KERNELS=" + kernels.string()}));
  INFO(compiled.output);
  CHECK(compiled.exit_code != 0);
  CHECK_THAT(compiled.output, ContainsSubstring(absent.string()));
  CHECK(test::slurp(kernel) == "kernel one");
  CHECK(s3->head("v/" + calls + "/.compilation_complete").has_value());
  CHECK_FALSE(s3->head("v/" + calls_absent + "/.compilation_complete").has_value());
  CHECK_FALSE(s3->head("v/" + calls_absent + "/.neffcache-failed.log").has_value());

  // A link planted in a shared kernel folder leads nowhere: a kernel reached through it is
  // not uploaded, and a bucket's kernel is not written through it.
  const fs::path outside = dir / "outside";
  test::spit(outside / "secret.klir", "not a kernel");
  fs::create_directory_symlink(outside, kernels / "planted");
  const std::string via_link = test::lnl_key("calls through a link");
  test::make_lnl_entry(dir / "local2", "gopjrt_tuple.hlo.pb", via_link, {"-O1"});
  test::spit(dir / "local2" / via_link / "graph.hlo", test::graph_calling((kernels / "planted" / "secret.klir").string()));
  // A FIFO as a kernel blocks nothing: it is no regular file.
  const std::string via_fifo = test::lnl_key("calls a FIFO");
  REQUIRE(::mkfifo((kernels / "fifo.klir").c_str(), 0644) == 0);
  test::make_lnl_entry(dir / "local2", "gopjrt_tuple.hlo.pb", via_fifo, {"-O1"});
  test::spit(dir / "local2" / via_fifo / "graph.hlo", test::graph_calling((kernels / "fifo.klir").string()));
  auto linked = tool({"sync", "push", (dir / "local2").string(), url, "--nki-kernels", kernels.string()});
  CHECK(linked.exit_code == 0);
  CHECK_THAT(linked.output, ContainsSubstring("planted/secret.klir is not on this host"));
  CHECK_THAT(linked.output, ContainsSubstring("fifo.klir is not on this host (fifo.klir: the NKI kernel is not a regular file)"));
  CHECK_FALSE(s3->head("v/.neffcache/nki-kernels/planted/secret.klir").has_value());
  REQUIRE(s3->put("v/.neffcache/nki-kernels/planted/dropped.klir", "dropped through a link").has_value());
  auto through = tool({"sync", "pull", (dir / "pulled").string(), url, "--nki-kernels", kernels.string()});
  CHECK(through.exit_code != 0);
  CHECK_FALSE(fs::exists(outside / "dropped.klir"));

  // A kernel folder must be absolute: graphs name kernels by absolute path.
  auto bad = tool({"sync", "pull", (dir / "pulled").string(), url, "--nki-kernels", "relative/kernels"});
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, ContainsSubstring("--nki-kernels relative/kernels: the kernel folder must be an absolute path"));
}
