// Compiling LNL entries with the real process runner and fake-neuronx-cc: the entry's
// own arguments, LNL's files and marker, our failure record, the client's lock.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <set>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/cache/maintenance.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/compile/prepare.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "hlo_variants.hpp"
#include "lnl.hpp"
#include "nki.hpp"
#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;

namespace {

CompileSettings lnl_settings(const test::TempDir& work) {
  CompileSettings s;
  // Only the program counts for an entry with command.txt; the rest is for one without.
  s.compiler = CompilerTemplate::parse(std::string(test::path::fake_compiler) +
                                       " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}")
                   .value();
  s.workdir_root = work.path().string();
  s.kill_grace = 500ms;
  return s;
}

}  // namespace

TEST_CASE("an LNL entry compiles with its own command, publishes LNL's files and writes the marker last", "[lnl][compile]") {
  test::TempDir root, work;
  const std::string key = test::lnl_key("compile");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key, {"--model-type", "transformer", "-O1"});
  auto r = compile_entry(dir.string(), lnl_settings(work));
  REQUIRE(r.outcome == CompileOutcome::success);
  const auto neff_path = dir / lnl_neff_name(key);
  auto neff = fake::parse_fake_neff(test::slurp(neff_path));
  REQUIRE(neff.has_value());
  // The compiler saw the entry's arguments and target, not the template's.
  CHECK(neff->flags == R"(["--target=trn1", "--model-type=transformer", "-O1"])");
  // LNL's marker: "completed:<unix time>\nneff_size:<bytes>\n", the time as Python prints
  // time.time(): a float.
  auto marker = test::slurp(dir / ".compilation_complete");
  CHECK(std::regex_match(marker, std::regex("completed:[0-9]+\\.[0-9]+\nneff_size:[0-9]+\n")));
  auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  double t = 0;
  long long size = 0;
  REQUIRE(std::sscanf(marker.c_str(), "completed:%lf\nneff_size:%lld\n", &t, &size) == 2);
  CHECK(std::abs(now - t) < 60);
  CHECK(size == static_cast<long long>(test::fs::file_size(neff_path)));
  // The marker is written last: no file in the folder is newer.
  for (const auto& f : test::fs::directory_iterator(dir))
    CHECK(f.last_write_time() <= test::fs::last_write_time(dir / ".compilation_complete"));
  // The compiler's log as LNL keeps it; no Neuron file in an LNL entry, and none of ours:
  // save_cache() copies every file of the folder. Our record is in the cache's own folder.
  CHECK(test::slurp(dir / "log-neuron-cc.txt").find("Compiler status PASS") != std::string::npos);
  CHECK_FALSE(test::fs::exists(dir / "model.neff"));
  CHECK_FALSE(test::fs::exists(dir / "model.done"));
  CHECK(test::names_in(dir) == std::set<std::string>{".artifact_metadata_v0.json", ".compilation_complete", "command.txt",
                                                     "graph.hlo", lnl_neff_name(key), "log-neuron-cc.txt"});
  CHECK(own_files(dir.string()).record == (root.path() / ".neffcache/lnl" / (key + ".meta.json")).string());
  auto meta = nlohmann::json::parse(test::slurp(own_files(dir.string()).record));
  CHECK(meta["size"] == size);
  CHECK(meta["flags"] == std::vector<std::string>{"--target=trn1", "--model-type", "transformer", "-O1"});
  // The command ran in a work folder: no path of the host that wrote command.txt.
  for (const auto& arg : meta["compiler"]) CHECK(arg.get<std::string>().find("/home/ubuntu") == std::string::npos);
  // Done now: a second compile is no compile.
  CHECK(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::already_done);
  CHECK(test::fs::is_empty(work.path()));
}

TEST_CASE("an LNL entry with LNL's metadata but no command.txt compiles with the compiler template", "[lnl][compile]") {
  test::TempDir root, work;
  const std::string key = test::lnl_key("metadata-only");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key, {}, /*with_command=*/false);
  auto s = lnl_settings(work);
  s.default_flags = {"-O2"};
  REQUIRE(compile_entry(dir.string(), s).outcome == CompileOutcome::success);
  auto neff = fake::parse_fake_neff(test::slurp(dir / lnl_neff_name(key)));
  REQUIRE(neff.has_value());
  CHECK(neff->flags == R"(["--target=trn1", "-O2"])");
  CHECK(test::fs::exists(dir / ".compilation_complete"));
}

TEST_CASE("a partial LNL entry is compiled again and its leftovers replaced", "[lnl][compile]") {
  test::TempDir root, work;
  const std::string key = test::lnl_key("partial");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  test::spit(dir / lnl_neff_name(key), "the first half of a NEFF");
  test::spit(dir / "log-neuron-cc.txt", "killed");
  REQUIRE(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::success);
  CHECK(fake::parse_fake_neff(test::slurp(dir / lnl_neff_name(key))).has_value());
  CHECK(test::slurp(dir / "log-neuron-cc.txt").find("killed") == std::string::npos);
}

TEST_CASE("a failed LNL compile is our record, never LNL's marker; a retry clears it", "[lnl][compile]") {
  test::TempDir root, work, gate_dir;
  const std::string key = test::lnl_key("failing");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  auto gate = gate_dir.path() / "failing";
  test::touch(gate);
  test::ScopedEnv fail("NEFFCACHE_FAKE_FAIL", "1"), fail_while("NEFFCACHE_FAKE_FAIL_WHILE", gate.string());
  auto r = compile_entry(dir.string(), lnl_settings(work));
  CHECK(r.outcome == CompileOutcome::failed);
  const std::string failure = own_files(dir.string()).failure;
  CHECK(test::slurp(failure).find("injected compile failure") != std::string::npos);
  CHECK(test::names_in(dir) == std::set<std::string>{".artifact_metadata_v0.json", "command.txt", "graph.hlo"});
  CHECK_FALSE(test::fs::exists(dir / lnl_neff_name(key)));
  CHECK(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::failed_cached);
  test::fs::remove(gate);
  auto s = lnl_settings(work);
  s.retry_failed = true;
  CHECK(compile_entry(dir.string(), s).outcome == CompileOutcome::success);
  CHECK_FALSE(test::fs::exists(failure));
}

TEST_CASE("an LNL entry of an earlier version: our files in its folder are read, then moved out of it", "[lnl][compile]") {
  test::TempDir root, work;
  const std::string key = test::lnl_key("legacy"), failed_key = test::lnl_key("legacy-failed");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  REQUIRE(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::success);
  // As an earlier version left it: the record, a compile log and a publish's
  // temporaries inside the key folder.
  const OwnFiles own = own_files(dir.string());
  test::fs::rename(own.record, dir / ".neffcache-meta.json");
  test::spit(dir / ".neffcache-compile.log", "compiling");
  test::spit(dir / ".neffcache-neff-0123", "half a NEFF");
  test::spit(dir / ".compilation_complete.neffcache-tmp.0badf00d", "completed:");
  // Names of ours that someone at work owns stay: a download's temporary (the S3 tier
  // fetching an input), an S3 lease, a layer's opaque marker.
  for (const char* theirs : {"graph.hlo.neffcache-tmp.00c0ffee", ".neffcache-lease", ".neffcache-opaque"})
    test::spit(dir / theirs, "");
  auto failed = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", failed_key);
  test::spit(failed / ".neffcache-failed.log", "an old failure");
  // Read where they are.
  CHECK(detail::read_entry_meta(dir.string()).contains("xxh3"));
  CHECK(read_entry_files(failed.string())->failed());
  // Moved out (every entry of the root, each under its lock), and the rest removed.
  CHECK(move_own_files_out(root.path().string()) == 2);
  CHECK(test::names_in(dir) == std::set<std::string>{".artifact_metadata_v0.json", ".compilation_complete", "command.txt",
                                                     "graph.hlo", lnl_neff_name(key), "log-neuron-cc.txt",
                                                     "graph.hlo.neffcache-tmp.00c0ffee", ".neffcache-lease",
                                                     ".neffcache-opaque"});
  CHECK(detail::read_entry_meta(dir.string()).contains("xxh3"));
  CHECK(test::fs::exists(own.record));
  CHECK(test::slurp(own_files(failed.string()).failure) == "an old failure");
  CHECK(read_entry_files(failed.string())->failed());
  // Every entry clean: later starts look no more.
  CHECK(test::fs::exists(root.path() / ".neffcache/lnl/.moved-out"));
  test::spit(dir / ".neffcache-compile.log", "left by an older daemon since");
  CHECK(move_own_files_out(root.path().string()) == 0);
  // A failure record counts while it is no older than graph.hlo: a rank that wrote the
  // graph again since (to compile the key itself) made it moot.
  test::fs::last_write_time(failed / "graph.hlo", test::fs::file_time_type::clock::now() + std::chrono::seconds(5));
  CHECK_FALSE(read_entry_files(failed.string())->failed());
}

TEST_CASE("our publish interrupted after its NEFF went in place is finished, not compiled again; a leftover is compiled",
          "[lnl][compile]") {
  test::TempDir root, work, log_dir;
  const std::string key = test::lnl_key("interrupted");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  REQUIRE(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::success);
  const std::string neff = test::slurp(dir / lnl_neff_name(key));
  // A crash between the NEFF's rename and the marker.
  test::fs::remove(dir / ".compilation_complete");
  auto files = read_entry_files(dir.string());
  REQUIRE(files.has_value());
  CHECK(classify(*files, [] { return false; }) == EntryState::partial);
  CHECK(publish_interrupted(dir.string(), *files));
  const auto compiles = log_dir.path() / "compiles";
  test::ScopedEnv log("NEFFCACHE_FAKE_LOG", compiles.string());
  CHECK(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::already_done);
  CHECK_FALSE(test::fs::exists(compiles));
  CHECK(read_entry_files(dir.string())->done());
  CHECK(test::slurp(dir / lnl_neff_name(key)) == neff);

  SECTION("a NEFF that is not the one recorded (changed in place, or another file) is a leftover") {
    test::fs::remove(dir / ".compilation_complete");
    SECTION("another file") {
      test::fs::remove(dir / lnl_neff_name(key));
      test::spit(dir / lnl_neff_name(key), neff);
    }
    SECTION("its bytes changed, its times kept") {
      const auto mtime = test::fs::last_write_time(dir / lnl_neff_name(key));
      {
        std::fstream f(dir / lnl_neff_name(key), std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(3);
        f.put('!');
      }
      test::fs::last_write_time(dir / lnl_neff_name(key), mtime);
    }
    CHECK(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::success);
    CHECK(test::fs::exists(compiles));
    CHECK(test::slurp(dir / lnl_neff_name(key)) == neff);
  }
}

TEST_CASE("a command.txt we cannot use (empty: LNL still writing it; bad) is never recorded as a failure",
          "[lnl][compile]") {
  test::TempDir root, work;
  const std::string key = test::lnl_key("bad-command");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  for (const char* text : {"", "neuronx-cc --help\n"}) {
    test::spit(dir / "command.txt", text);
    auto r = compile_entry(dir.string(), lnl_settings(work));
    CHECK(r.outcome == CompileOutcome::transient);
    CHECK(r.attempts == 0);
    CHECK(r.message.find("command.txt") != std::string::npos);
    CHECK_FALSE(test::fs::exists(own_files(dir.string()).failure));
  }
  // Once whole, it compiles.
  test::spit(dir / "command.txt", test::lnl_command_text(key, {"-O1"}));
  CHECK(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::success);
}

TEST_CASE("a client compiling an LNL entry under its flock makes ours busy, and its result wins", "[lnl][compile]") {
  test::TempDir root, work;
  const std::string key = test::lnl_key("client");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  int fd = ::open(test::lnl_lock(root.path(), key).c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  auto r = compile_entry(dir.string(), lnl_settings(work));
  CHECK(r.outcome == CompileOutcome::busy);
  // The client publishes as LNL does, marker last, then lets go.
  test::spit(dir / lnl_neff_name(key), "the client's NEFF");
  test::spit(dir / ".compilation_complete", lnl_marker(1, 17));
  ::close(fd);
  CHECK(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::already_done);
  CHECK(test::slurp(dir / lnl_neff_name(key)) == "the client's NEFF");
}

TEST_CASE("an LNL job is sized from its graph for the scheduler", "[lnl][compile]") {
  test::TempDir root;
  const std::string key = test::lnl_key("prepare");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  auto spec = prepare_job(dir.string());
  CHECK(spec.entry_dir == dir.string());
  CHECK(spec.instructions > 0);
  CHECK(spec.hlo_bytes == test::fs::file_size(dir / "graph.hlo"));
}

using test::base64;
using test::graph_calling;

TEST_CASE("NKI kernels are read from backend_config: base64 or plain JSON, anything else names none", "[lnl][nki]") {
  using neffcache::detail::nki_kernel_path;
  const std::string json = R"({"klir_binary": {"binary": "/var/tmp/nki-intermediate-cache/k1.klir"}})";
  CHECK(nki_kernel_path(base64(json)) == "/var/tmp/nki-intermediate-cache/k1.klir");
  CHECK(nki_kernel_path(json) == "/var/tmp/nki-intermediate-cache/k1.klir");
  for (std::string_view other : {"", "{", "bm90IGpzb24=", "{\"klir_binary\": 3}", "{\"klir_binary\": {\"binary\": \"\"}}",
                                 "xyz", "{\"fusion_kind\": \"kLoop\"}"})
    CHECK_FALSE(nki_kernel_path(other).has_value());
  auto a = analyze_hlo(graph_calling("/nki/k2.klir"));
  REQUIRE(a.has_value());
  CHECK(a->stats.kernel_files == std::set<std::string>{"/nki/k2.klir"});
  CHECK(analyze_hlo(test::slurp(test::k_corpus / "gopjrt_tuple.hlo.pb"))->stats.kernel_files.empty());
}

TEST_CASE("a graph calling an NKI kernel this host lacks is refused before the compiler runs, never recorded", "[lnl][nki][compile]") {
  test::TempDir root, work, kernels;
  const std::string key = test::lnl_key("nki");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  const auto kernel = kernels.path() / "nki-intermediate-cache" / "k.klir";
  test::spit(dir / "graph.hlo", graph_calling(kernel.string()));
  auto r = compile_entry(dir.string(), lnl_settings(work));
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(r.attempts == 0);
  CHECK(r.message.find(kernel.string()) != std::string::npos);
  CHECK(r.message.find("not on this host") != std::string::npos);
  CHECK_FALSE(test::fs::exists(own_files(dir.string()).failure));
  // Once the kernel is here (a sync pull, say), the graph compiles.
  test::spit(kernel, "a kernel binary");
  CHECK(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::success);
}

TEST_CASE("an LNL result its client compiled is never filed under our compiler, nor copied to a twin",
          "[lnl][index][compile]") {
  test::TempDir root, work;
  const auto s = lnl_settings(work);
  const std::string client = test::lnl_key("client's"), ours = test::lnl_key("ours"), other = test::lnl_key("other");
  for (const auto& key : {client, ours, other}) test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key, {"-O1"});
  // The job's identity, as prepare_job makes it with the compiler's version.
  const auto key = prepare_job((root / client).string(), {}, compiler_version(s).value_or("")).dedup_key;
  auto id = ContentId::parse(key);
  REQUIRE(id.has_value());
  CHECK(id->compiler_dir == "neuronxcc-2.21.0");
  CHECK(prepare_job((root / ours).string(), {}, compiler_version(s).value_or("")).dedup_key == key);

  // The client compiled its entry while our job waited: already done, by an unknown compiler.
  test::spit(root / client / lnl_neff_name(client), "the client's NEFF");
  test::spit(root / client / ".compilation_complete", lnl_marker(1, 17));
  const ContentIndex index(root.path().string());
  folder_record((root / client).string(), key, CompileResult::of(CompileOutcome::already_done, ""), s);
  CHECK(index.records(*id).empty());
  auto copied = copy_result((root / client).string(), (root / other).string(), s);
  CHECK(copied.outcome == CompileOutcome::transient);
  CHECK_FALSE(test::fs::exists(root / other / lnl_neff_name(other)));

  // Ours, compiled here: recorded under the version it names, and copied to a twin.
  REQUIRE(compile_entry((root / ours).string(), s).outcome == CompileOutcome::success);
  folder_record((root / ours).string(), key, CompileResult::of(CompileOutcome::success, ""), s);
  REQUIRE(index.records(*id).size() == 1);
  CHECK(index.records(*id).front().entry == ours);
  CHECK(copy_result((root / ours).string(), (root / other).string(), s).outcome == CompileOutcome::success);
  CHECK(test::slurp(root / other / lnl_neff_name(other)) == test::slurp(root / ours / lnl_neff_name(ours)));
  // A client that compiles our entry again leaves our record behind: it no longer names the NEFF.
  test::spit(root / ours / lnl_neff_name(ours), "recompiled by the client");
  CHECK_FALSE(neffcache::detail::recorded_compiler_version((root / ours).string()).has_value());
}
