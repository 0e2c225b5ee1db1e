// The content index and twins: an entry whose graph was compiled before under another
// name gets that result (a link of the same file) instead of a compile, across
// schedulers (restarts) and for entries written by other tools; records are hints that
// are checked, and the index's own failures never fail a publish.
#include <sys/stat.h>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/cache/index.hpp>
#include <neffcache/compile/prepare.hpp>
#include <neffcache/compile/scheduler.hpp>
#include <neffcache/store/directory.hpp>

#include "hlo_variants.hpp"
#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using test::k_fake;
constexpr const char* k_graph = "spu_jax_cnn.hlo.pb";

// A pending entry holding `hlo` under the cache `root`.
std::string put_entry(const fs::path& root, const std::string& name, const std::string& hlo) {
  auto dir = root / "neuronxcc-2.21.0" / ("MODULE_" + name);
  fs::create_directories(dir);
  test::spit(dir / "model.hlo_module.pb", hlo);
  return dir.string();
}

// One scheduler's run over `entries` (a daemon's or a tool's lifetime): its counters.
Progress run(const test::TempDir& work, const std::vector<std::string>& entries) {
  Scheduler::Options o;
  o.jobs = 2;
  o.settings.compiler =
      CompilerTemplate::parse(k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}").value();
  o.settings.workdir_root = work.path().string();
  Scheduler s(o);
  for (const auto& e : entries) s.submit(prepare_job(e), Priority::waiting);
  s.wait_idle();
  return s.progress();
}

ino_t inode(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_ino;
}

nlohmann::json meta_of(const std::string& entry) { return detail::read_entry_meta(entry); }

}  // namespace

TEST_CASE("a content identity parses only as one path inside the index", "[index]") {
  const std::string sha(64, 'a');
  auto id = ContentId::parse("neuronxcc-2.21.0/" + sha + "+0123abcd");
  REQUIRE(id);
  CHECK(id->compiler_dir == "neuronxcc-2.21.0");
  CHECK(id->str() == "neuronxcc-2.21.0/" + sha + "+0123abcd");
  // Real compiler versions carry a '+' of their own.
  auto plus = ContentId::parse("neuronxcc-2.15.128.0+56dc5a86/" + sha + "+0123abcd");
  REQUIRE(plus);
  CHECK(plus->compiler_dir == "neuronxcc-2.15.128.0+56dc5a86");
  CHECK(plus->flags_hash == "0123abcd");
  for (std::string bad : std::vector<std::string>{"entry:/x/y", "neuronxcc-2.21.0/" + sha, "../" + sha + "+0123abcd",
                          "neuronxcc-../" + sha + "+0123abcd", "neuronxcc-2/" + sha.substr(1) + "+0123abcd",
                          "neuronxcc-2/" + sha + "+0123abcX", "other-2/" + sha + "+0123abcd"})
    CHECK_FALSE(ContentId::parse(bad));
}

TEST_CASE("a metadata twin of a done entry gets its NEFF, linked, with no compile, in a later run", "[index]") {
  test::TempDir dir, work;
  const std::string hlo = test::slurp(test::k_corpus / k_graph);
  auto a = put_entry(dir.path(), "a", hlo);
  auto first = run(work, {a});
  CHECK(first.compiles_started == 1);

  // A later process (a restarted daemon): the twin is found in the index on disk.
  auto b = put_entry(dir.path(), "b", test::debug_variant(hlo));
  REQUIRE(test::slurp(fs::path(b) / "model.hlo_module.pb") != hlo);
  auto second = run(work, {b});
  CHECK(second.compiles_started == 0);
  CHECK(second.twins_served == 1);
  CHECK(second.twin_seconds_saved == meta_of(a)["compile_seconds"].get<double>());
  CHECK(test::slurp(fs::path(b) / "model.neff") == test::slurp(fs::path(a) / "model.neff"));
  CHECK(fs::exists(fs::path(b) / "model.done"));
  CHECK(inode(fs::path(b) / "model.neff") == inode(fs::path(a) / "model.neff"));  // a link, not a copy
  auto meta = meta_of(b);
  CHECK(meta["copied_from"] == "neuronxcc-2.21.0/MODULE_a");
  CHECK(meta["copy"] == "link");
  CHECK(verify_neff(b).check == NeffCheck::ok);

  // Another graph (one opcode) is no twin: it compiles.
  auto c = put_entry(dir.path(), "c", test::opcode_variant(hlo));
  CHECK(run(work, {c}).compiles_started == 1);
  CHECK_FALSE(meta_of(c).contains("copied_from"));
}

TEST_CASE("a done entry written by another tool is indexed by a scan, then serves its twins", "[index]") {
  test::TempDir dir, work;
  const std::string hlo = test::slurp(test::k_corpus / k_graph);
  // Written straight into the folder, as a Neuron client leaves it: no metadata of ours.
  auto a = put_entry(dir.path(), "client", hlo);
  test::spit(fs::path(a) / "model.neff", "a NEFF from elsewhere");
  test::spit(fs::path(a) / "model.done", "");
  ContentIndex index(dir.path().string());
  auto scan = index_unknown_entries(index, 100);
  CHECK(scan.entries == 1);
  CHECK(scan.added == 1);
  CHECK(index_unknown_entries(index, 100).added == 0);  // known now: nothing read again

  auto b = put_entry(dir.path(), "b", test::debug_variant(hlo));
  CHECK(run(work, {b}).compiles_started == 0);
  CHECK(test::slurp(fs::path(b) / "model.neff") == "a NEFF from elsewhere");

  // --rebuild forgets everything and finds both again.
  auto rebuilt = rebuild_index(index);
  CHECK(rebuilt.entries == 2);
  CHECK(rebuilt.added == 2);
}

TEST_CASE("index records are hints: changed, removed or corrupt targets are dropped, never served", "[index]") {
  test::TempDir dir, work;
  const std::string hlo = test::slurp(test::k_corpus / k_graph);
  auto a = put_entry(dir.path(), "a", hlo);
  REQUIRE(run(work, {a}).compiles_succeeded == 1);
  auto id = ContentId::parse(prepare_job(put_entry(dir.path(), "probe", hlo)).dedup_key);
  REQUIRE(id);
  ContentIndex index(dir.path().string());
  REQUIRE(index.records(*id).size() == 1);

  SECTION("a NEFF changed behind our back, same size") {
    std::string neff = test::slurp(fs::path(a) / "model.neff");
    neff[neff.size() / 2] ^= 1;
    fs::remove(fs::path(a) / "model.neff");  // a new inode, as an editor or a copy makes
    test::spit(fs::path(a) / "model.neff", neff);
    std::vector<std::string> logged;
    CHECK_FALSE(index.find(*id, "", false, [&](std::string_view l) { logged.emplace_back(l); }));
    REQUIRE(logged.size() == 1);
    CHECK(logged[0].find("checksum") != std::string::npos);
    CHECK(index.records(*id).empty());  // dropped: logged once
    auto b = put_entry(dir.path(), "b", hlo);
    CHECK(run(work, {b}).compiles_started == 1);
    CHECK(test::slurp(fs::path(b) / "model.neff") != neff);
  }
  SECTION("a NEFF changed in place (same inode, new mtime)") {
    {
      std::fstream f(fs::path(a) / "model.neff", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(3);
      f.put('#');
    }
    struct timespec later[2] = {{0, UTIME_OMIT}, {::time(nullptr) + 5, 0}};
    REQUIRE(::utimensat(AT_FDCWD, (fs::path(a) / "model.neff").c_str(), later, 0) == 0);
    CHECK_FALSE(index.find(*id, "", false));
  }
  SECTION("the twin was removed behind our back") {
    fs::remove_all(a);
    CHECK_FALSE(index.find(*id, "", false));
    CHECK(index.records(*id).empty());
  }
  SECTION("the twin was made pending again") {
    fs::remove(fs::path(a) / "model.done");
    CHECK_FALSE(index.find(*id, "", false));
  }
  SECTION("a corrupt record, and one pointing outside the cache") {
    const fs::path rec = dir.path() / ".neffcache/index/by-id" / id->compiler_dir /
                         (id->graph_sha256 + "+" + id->flags_hash) / "MODULE_a";
    REQUIRE(fs::exists(rec));
    test::spit(rec, "{not json");
    CHECK_FALSE(index.find(*id, "", false));
    test::spit(rec, R"({"entry": "../../etc", "result": "neff", "size": 1, "xxh3": "0000000000000000", "ino": 1, "mtime_ns": 1})");
    CHECK_FALSE(index.find(*id, "", false));
    auto b = put_entry(dir.path(), "b", hlo);
    CHECK(run(work, {b}).compiles_started == 1);
  }
}

TEST_CASE("an index that cannot be written costs twins, never a publish", "[index]") {
  test::TempDir dir, work;
  const std::string hlo = test::slurp(test::k_corpus / k_graph);
  auto a = put_entry(dir.path(), "a", hlo);
  {
    std::atomic<int> refused{0};
    sys::ScopedFaultHook full([&](sys::Call c, std::string_view path) {
      if ((c == sys::Call::open || c == sys::Call::mkdir) && path.find("/.neffcache/index") != std::string_view::npos)
        return ++refused, ENOSPC;
      return 0;
    });
    auto p = run(work, {a});
    CHECK(p.compiles_succeeded == 1);
    CHECK(refused > 0);
  }
  CHECK(verify_neff(a).check == NeffCheck::ok);
  CHECK_FALSE(fs::exists(dir.path() / ".neffcache/index/by-entry/neuronxcc-2.21.0/MODULE_a"));
  // The next scan records it.
  CHECK(index_unknown_entries(ContentIndex(dir.path().string()), 10).added == 1);
}

TEST_CASE("equal graphs published at once: every entry done with the right NEFF, each recorded", "[index]") {
  test::TempDir dir, work;
  const std::string hlo = test::slurp(test::k_corpus / k_graph);
  std::vector<std::string> entries;
  for (int i = 0; i < 4; ++i) entries.push_back(put_entry(dir.path(), fmt::format("r{}", i), test::debug_variant(hlo)));
  // Two schedulers (two processes' worth) race for the same identity.
  std::thread other([&] { run(work, {entries[2], entries[3]}); });
  run(work, {entries[0], entries[1]});
  other.join();
  // Each NEFF is whole and the one its entry's record describes (a copy is its source's).
  for (const auto& e : entries) {
    CHECK(verify_neff(e).check == NeffCheck::ok);
    auto meta = meta_of(e);
    if (meta.contains("copied_from"))
      CHECK(test::slurp(fs::path(e) / "model.neff") ==
            test::slurp(dir.path() / meta["copied_from"].get<std::string>() / "model.neff"));
  }
  auto id = ContentId::parse(prepare_job(put_entry(dir.path(), "probe", hlo)).dedup_key);
  CHECK(ContentIndex(dir.path().string()).records(*id).size() == 4);
}

TEST_CASE("a deterministic failure is reused by twins, and retry clears it for every twin", "[index]") {
  test::TempDir dir, work;
  const std::string hlo = test::slurp(test::k_corpus / k_graph);
  auto a = put_entry(dir.path(), "a", hlo);
  Scheduler::Options o;
  o.settings.compiler = CompilerTemplate::parse("false {hlo} {neff}").value();
  o.settings.compiler_version = std::string(test::k_fake_version);  // (false reports none)
  o.settings.workdir_root = work.path().string();
  {
    Scheduler s(o);
    CHECK(s.submit(prepare_job(a), Priority::waiting).get().outcome == CompileOutcome::failed);
  }
  auto b = put_entry(dir.path(), "b", test::debug_variant(hlo));
  {
    Scheduler s(o);
    auto r = s.submit(prepare_job(b), Priority::waiting).get();
    CHECK(r.outcome == CompileOutcome::failed);
    CHECK(r.attempts == 0);  // not compiled: the twin's failure
    CHECK(r.message.find("MODULE_a") != std::string::npos);
  }
  CHECK(fs::exists(fs::path(b) / "model.log"));
  auto store = store::DirectoryStore::open(dir.path().string());
  REQUIRE(store->clear_failure(*store->named(b)).value());
  CHECK_FALSE(fs::exists(fs::path(b) / "model.log"));
  CHECK_FALSE(fs::exists(fs::path(a) / "model.log"));  // its twin's too
  CHECK(run(work, {b}).compiles_started == 1);
}

TEST_CASE("a twin for another owner is copied, and checked against its record as it is copied", "[index]") {
  test::TempDir dir, work;
  const std::string hlo = test::slurp(test::k_corpus / k_graph);
  auto a = put_entry(dir.path(), "a", hlo);
  REQUIRE(run(work, {a}).compiles_succeeded == 1);
  ContentIndex index(dir.path().string());
  auto id = entry_content_id(a);
  REQUIRE(id);
  auto twin = index.find(*id, "", false);
  REQUIRE(twin);
  const fs::path neff = fs::path(a) / "model.neff";
  struct stat st {};
  REQUIRE(::stat(neff.c_str(), &st) == 0);
  // Files of another owner: no link (it would share the twin's owner), a copy or a reflink.
  const detail::FileOwner other{st.st_uid + 1, st.st_gid + 1};
  const fs::path placed = dir.path() / "placed";
  auto how = detail::place_twin_neff(*twin, placed.string(), other);
  REQUIRE(how.has_value());
  CHECK((*how == "copy" || *how == "reflink"));
  CHECK(inode(placed) != inode(neff));
  CHECK(test::slurp(placed) == test::slurp(neff));
  if (::geteuid() == 0) {
    struct stat pst {};
    REQUIRE(::stat(placed.c_str(), &pst) == 0);
    CHECK(pst.st_uid == other.uid);
  }
  if (*how == "copy") {  // (a reflink takes the file as it is: the index checked it)
    twin->record.xxh3 = "0000000000000000";
    const fs::path again = dir.path() / "again";
    auto refused = detail::place_twin_neff(*twin, again.string(), other);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().message.find("changed while it was copied") != std::string::npos);
    CHECK_FALSE(fs::exists(again));
  }
}

TEST_CASE("a NEFF's checksum is its publication record's only while the record describes that file", "[index]") {
  test::TempDir dir;
  const fs::path entry = dir.path() / "neuronxcc-2.21.0" / "MODULE_a";
  const fs::path neff = entry / "model.neff", meta_path = entry / ".neffcache-meta.json";
  const std::string bytes = "0123456789";
  test::spit(neff, bytes);
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(neff, now - 1h);
  struct stat st {};
  auto fd = detail::open_regular(neff.string(), &st);
  REQUIRE(fd.has_value());
  const std::string hashed = detail::xxh3_hex(XXH3_64bits(bytes.data(), bytes.size()));
  auto hash = [&] { return detail::neff_xxh3(entry.string(), fd->get(), st).value(); };

  SECTION("a record that names the file (this version's): by its size and mtime") {
    // A checksum that is not the file's: used only when the record is trusted.
    nlohmann::ordered_json meta{{"xxh3", "00000000000000aa"}, {"compile_seconds", 2}};
    detail::describe_neff(meta, st);
    test::spit(meta_path, meta.dump());
    CHECK(detail::read_entry_meta(entry.string())["compile_seconds"] == 2);
    CHECK(hash() == "00000000000000aa");
    SECTION("a faithful copy of it (cp -a: another inode, the same size and mtime): still described") {
      meta["ino"] = static_cast<uint64_t>(st.st_ino) + 1;
      test::spit(meta_path, meta.dump());
      CHECK(hash() == "00000000000000aa");
    }
    SECTION("another file in its place, or the file written since (another mtime): hashed") {
      meta["mtime_ns"] = detail::mtime_ns(st) - 1;
      test::spit(meta_path, meta.dump());
      CHECK(hash() == hashed);
    }
  }
  SECTION("an earlier version's record, which names no file: while its size holds and the NEFF is no newer") {
    test::spit(meta_path, R"({"size": 10, "xxh3": "00000000000000aa", "compile_seconds": 2})");
    CHECK(hash() == "00000000000000aa");
    SECTION("the NEFF changed after its record: hashed") {
      fs::last_write_time(meta_path, now - 2h);
      CHECK(hash() == hashed);
    }
    SECTION("a record of another size: hashed") {
      test::spit(meta_path, R"({"size": 11, "xxh3": "00000000000000aa"})");
      CHECK(hash() == hashed);
    }
  }
  SECTION("no record, or no JSON object: hashed") {
    test::spit(meta_path, "[1, 2]");
    CHECK(detail::read_entry_meta(entry.string()) == nlohmann::json::object());
    CHECK(hash() == hashed);
  }
}

TEST_CASE("a scan cut short says whether its limit or its caller stopped it", "[index]") {
  test::TempDir dir;
  const std::string hlo = test::slurp(test::k_corpus / k_graph);
  for (const char* name : {"a", "b"}) {
    auto e = put_entry(dir.path(), name, name == std::string("a") ? hlo : test::debug_variant(hlo));
    test::spit(fs::path(e) / "model.neff", "a NEFF from elsewhere");
    test::spit(fs::path(e) / "model.done", "");
  }
  ContentIndex index(dir.path().string());
  auto stopped = index_unknown_entries(index, 100, {}, [] { return true; });
  CHECK_FALSE(stopped.complete);
  CHECK(stopped.stopped);
  CHECK(stopped.added == 0);
  auto limited = index_unknown_entries(index, 1, {}, [] { return false; });
  CHECK_FALSE(limited.complete);
  CHECK_FALSE(limited.stopped);
  CHECK(limited.added == 1);
  auto rest = index_unknown_entries(index, 100);
  CHECK(rest.complete);
  CHECK_FALSE(rest.stopped);
  CHECK(rest.added == 1);
}
