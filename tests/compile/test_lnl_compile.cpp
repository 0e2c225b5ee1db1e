// Compiling LNL entries with the real process runner and fake-neuronx-cc: the entry's
// own arguments, LNL's files and marker, our failure record, the client's lock.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

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
  // LNL's marker: "completed:<unix time>\nneff_size:<bytes>\n".
  auto marker = test::slurp(dir / ".compilation_complete");
  auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  long long t = 0, size = 0;
  REQUIRE(std::sscanf(marker.c_str(), "completed:%lld\nneff_size:%lld\n", &t, &size) == 2);
  CHECK(marker == lnl_marker(t, static_cast<uint64_t>(size)));
  CHECK(std::llabs(now - t) < 60);
  CHECK(size == static_cast<long long>(test::fs::file_size(neff_path)));
  // The marker is written last: no file LNL knows is newer (our compile log goes on).
  for (const auto& f : test::fs::directory_iterator(dir))
    if (!f.path().filename().string().starts_with(".neffcache"))
      CHECK(f.last_write_time() <= test::fs::last_write_time(dir / ".compilation_complete"));
  // The compiler's log as LNL keeps it; no Neuron file in an LNL entry; our metadata.
  CHECK(test::slurp(dir / "log-neuron-cc.txt").find("Compiler status PASS") != std::string::npos);
  CHECK_FALSE(test::fs::exists(dir / "model.neff"));
  CHECK_FALSE(test::fs::exists(dir / "model.done"));
  auto meta = nlohmann::json::parse(test::slurp(dir / ".neffcache-meta.json"));
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
  CHECK(test::slurp(dir / ".neffcache-failed.log").find("injected compile failure") != std::string::npos);
  CHECK_FALSE(test::fs::exists(dir / ".compilation_complete"));
  CHECK_FALSE(test::fs::exists(dir / lnl_neff_name(key)));
  CHECK(compile_entry(dir.string(), lnl_settings(work)).outcome == CompileOutcome::failed_cached);
  test::fs::remove(gate);
  auto s = lnl_settings(work);
  s.retry_failed = true;
  CHECK(compile_entry(dir.string(), s).outcome == CompileOutcome::success);
  CHECK_FALSE(test::fs::exists(dir / ".neffcache-failed.log"));
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
    CHECK_FALSE(test::fs::exists(dir / ".neffcache-failed.log"));
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
  CHECK_FALSE(test::fs::exists(dir / ".neffcache-failed.log"));
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
