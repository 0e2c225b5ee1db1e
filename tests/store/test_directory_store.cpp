// The store interface on a directory cache (store/directory.hpp): listing states, naming
// entries from every form a command line gives, maintenance, and the refusals.
#include <fcntl.h>

#include <map>
#include <set>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <neffcache/store/directory.hpp>
#include <neffcache/store/open.hpp>

#include "lnl.hpp"
#include "support.hpp"
#include "store_support.hpp"

using namespace neffcache;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

const std::string k_pending = "neuronxcc-2.21.0/MODULE_1+4f2d9c1a";
const std::string k_done = "neuronxcc-2.21.0/MODULE_2+4f2d9c1a";
const std::string k_failed = "neuronxcc-2.21.0/MODULE_3+4f2d9c1a";
const std::string k_empty = "neuronxcc-2.20.0/MODULE_4+4f2d9c1a";

// One entry of each state without a lock under `root`.
void make_entries(const fs::path& root) {
  for (const auto& e : {k_pending, k_done, k_failed}) {
    test::spit(root / e / "model.hlo_module.pb", "hlo");
    test::spit(root / e / "compile_flags.json", R"(["--target=trn1"])");
  }
  test::spit(root / k_done / "model.neff", "neff bytes");
  test::touch(root / k_done / "model.done");
  test::spit(root / k_failed / "model.log", "it failed");
  fs::create_directories(root / k_empty);
}

}  // namespace

TEST_CASE("a directory store lists every entry with its state", "[store]") {
  test::TempDir dir;
  make_entries(dir.path());
  auto s = store::DirectoryStore::open(dir.path().string());
  CHECK(s->name() == dir.path().string());
  CHECK(test::entry_states(*s) == std::map<std::string, EntryState>{{k_pending, EntryState::pending},
                                                        {k_done, EntryState::done},
                                                        {k_failed, EntryState::failed},
                                                        {k_empty, EntryState::empty}});
  CHECK_FALSE(s->compiles_on_open());
  CHECK_FALSE(s->daemon_stats());
  CHECK(s->copies_equal_graphs());
  CHECK_FALSE(s->compile_function());

  auto missing = store::DirectoryStore::open((dir.path() / "nothing").string());
  auto err = missing->list();
  REQUIRE_FALSE(err.has_value());
  CHECK(err.error().code == Errc::not_found);
  auto none = missing->list(store::IfMissing::empty);
  REQUIRE(none.has_value());
  CHECK(none->empty());
}

TEST_CASE("a directory store names an entry from a folder, a file in it, or a path in the cache", "[store]") {
  test::TempDir dir;
  make_entries(dir.path());
  const std::string root = dir.path().string();
  auto s = store::DirectoryStore::open(root + "/");  // a trailing '/' is dropped
  CHECK(s->root() == root);
  for (const std::string& arg : {root + "/" + k_done, root + "/" + k_done + "/", root + "/" + k_done + "/model.neff",
                                k_done, k_done + "/model.hlo_module.pb", root + "/./neuronxcc-2.21.0/../" + k_done}) {
    INFO(arg);
    auto e = s->named(arg);
    REQUIRE(e.has_value());
    CHECK(e->path() == k_done);
    CHECK(&e->store() == s.get());
    CHECK(e->compiler_dir() == "neuronxcc-2.21.0");
    CHECK(e->view() == root + "/" + k_done);
  }
  auto nothing = s->named("neuronxcc-2.21.0/MODULE_nothing");
  REQUIRE_FALSE(nothing.has_value());
  CHECK(nothing.error().message ==
        "neuronxcc-2.21.0/MODULE_nothing: not a cache entry (a MODULE_* folder, or an LNL entry's: 32 hex digits in "
        "the cache)");
  CHECK_FALSE(s->named("neuronxcc-2.21.0").has_value());  // a compiler folder is no entry

  test::TempDir other;
  fs::create_directories(other.path() / "neuronxcc-2.21.0/MODULE_9+4f2d9c1a");
  auto outside = s->named((other.path() / "neuronxcc-2.21.0/MODULE_9+4f2d9c1a").string());
  REQUIRE_FALSE(outside.has_value());
  CHECK_THAT(outside.error().message, ContainsSubstring("not an entry of the cache " + root));

  auto bad = s->at("MODULE_1");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == Errc::invalid_argument);
  REQUIRE(s->at(k_pending).has_value());
  CHECK(*s->at(k_pending) == *s->named(k_pending));
  auto of = s->of_folder(root + "/" + k_failed);
  REQUIRE(of.has_value());
  CHECK(of->path() == k_failed);
  CHECK_FALSE(s->of_folder(root).has_value());
}

TEST_CASE("a directory store's maintenance changes entries under their lock", "[store]") {
  test::TempDir dir;
  make_entries(dir.path());
  auto s = store::DirectoryStore::open(dir.path().string());
  auto failed = *s->at(k_failed), done = *s->at(k_done), pending = *s->at(k_pending);

  auto cleared = s->clear_failure(failed);
  REQUIRE(cleared.has_value());
  CHECK(*cleared);
  cleared = s->clear_failure(failed);
  REQUIRE(cleared.has_value());
  CHECK_FALSE(*cleared);  // nothing recorded any more
  CHECK(test::entry_states(*s)[k_failed] == EntryState::pending);

  auto files = s->files(done);
  REQUIRE(files.has_value());
  CHECK(files->done());
  auto neff = s->local_file(done, "model.neff");
  REQUIRE(neff.has_value());
  CHECK(test::slurp(neff->path()) == "neff bytes");

  auto entries = s->list();
  REQUIRE(entries.has_value());
  for (const auto& e : *entries)
    if (e.path == k_done) CHECK(s->verify(e).check == NeffCheck::unrecorded);  // no record: present, not empty
  REQUIRE(s->clear_results(done).has_value());
  CHECK(test::entry_states(*s)[k_done] == EntryState::pending);
  CHECK(fs::exists(dir.path() / k_done / "model.hlo_module.pb"));

  REQUIRE(s->remove(pending).has_value());
  CHECK_FALSE(fs::exists(dir.path() / k_pending));
  REQUIRE(s->remove(*s->at(k_empty)).has_value());
  s->remove_empty_compiler_dirs({"neuronxcc-2.20.0", "neuronxcc-2.21.0"});
  CHECK_FALSE(fs::exists(dir.path() / "neuronxcc-2.20.0"));  // empty now
  CHECK(fs::exists(dir.path() / "neuronxcc-2.21.0"));        // still holds entries
}

TEST_CASE("a directory store stores a graph once", "[store]") {
  test::TempDir dir;
  auto s = store::DirectoryStore::open((dir.path() / "cache").string());
  auto e = *s->at(k_pending);
  auto created = s->put_graph(e, "hlo bytes", {"--target=trn1"});
  REQUIRE(created.has_value());
  CHECK(*created);
  CHECK(test::slurp(dir.path() / "cache" / k_pending / "model.hlo_module.pb") == "hlo bytes");
  created = s->put_graph(e, "other bytes", {});
  REQUIRE(created.has_value());
  CHECK_FALSE(*created);
  CHECK(test::entry_states(*s) == std::map<std::string, EntryState>{{k_pending, EntryState::pending}});
}

TEST_CASE("a directory store on a neffcachefs mount reads the backing folder", "[store]") {
  test::TempDir mount, backing;
  make_entries(backing.path());
  const std::string stats = fmt::format(R"({{"backing": "{}", "hits": 3}})", backing.path().string());
  test::spit(mount.path() / ".neffcache/stats.json", stats);
  auto s = store::DirectoryStore::open(mount.path().string());
  CHECK(s->backing() == backing.path().string());
  CHECK(s->compiles_on_open());
  REQUIRE(s->daemon_stats().has_value());
  CHECK(*s->daemon_stats() == stats);
  CHECK(test::entry_states(*s).size() == 4);
  // Named in the backing folder, seen through the mount.
  auto e = s->named((backing.path() / k_done).string());
  REQUIRE(e.has_value());
  CHECK(e->path() == k_done);
  CHECK(e->view() == (mount.path() / k_done).string());
}

TEST_CASE("open_store opens a folder or an s3:// URL, else the Neuron precedence", "[store]") {
  test::TempDir dir;
  auto s = store::open_store(dir.path().string());
  REQUIRE(s.has_value());
  CHECK((*s)->name() == dir.path().string());
  auto from_env = store::open_store("", test::env_of({{"NEURON_COMPILE_CACHE_URL", dir.path().string()}}));
  REQUIRE(from_env.has_value());
  CHECK((*from_env)->name() == dir.path().string());
  auto bad = store::open_store("ftp://nowhere");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == Errc::invalid_argument);
}

TEST_CASE("a directory store names an LNL entry by its key folder or a file in it, in the root only", "[store][lnl]") {
  test::TempDir dir;
  make_entries(dir.path());
  const std::string root = dir.path().string();
  const std::string key = test::lnl_key("named");
  test::make_lnl_entry(dir.path(), "gopjrt_tuple.hlo.pb", key);
  auto s = store::DirectoryStore::open(root);
  for (const std::string& arg : {key, key + "/", root + "/" + key, key + "/graph.hlo", root + "/" + key + "/command.txt"}) {
    INFO(arg);
    auto e = s->named(arg);
    REQUIRE(e.has_value());
    CHECK(e->path() == key);
    CHECK(e->dialect() == Dialect::lnl);
    CHECK(e->compiler_dir().empty());  // no compiler folder: clean and gc never rmdir the root
    CHECK(e->view() == root + "/" + key);
  }
  CHECK(s->named(k_done)->dialect() == Dialect::neuron);
  // A key-named folder anywhere but the root is no entry; a key that is no folder neither.
  fs::create_directories(dir.path() / "neuronxcc-2.21.0" / key);
  auto nested = s->named(root + "/neuronxcc-2.21.0/" + key);
  REQUIRE_FALSE(nested.has_value());
  CHECK_THAT(nested.error().message, ContainsSubstring("not an entry of the cache"));
  auto missing = s->named(test::lnl_key("missing"));
  REQUIRE_FALSE(missing.has_value());
  CHECK_THAT(missing.error().message, ContainsSubstring("LNL entry"));
  REQUIRE(s->at(key).has_value());
  CHECK(s->at(key)->dialect() == Dialect::lnl);
  // We never write Neuron files into an LNL entry.
  CHECK_FALSE(s->put_graph(*s->at(key), "hlo", {}).has_value());
  CHECK_FALSE(fs::exists(dir.path() / key / "model.hlo_module.pb"));
}

TEST_CASE("a directory's remote has nothing elsewhere: every call does nothing", "[store]") {
  test::TempDir root;
  make_entries(root.path());
  auto s = store::DirectoryStore::open(root.path().string());
  const store::Remote& remote = s->remote();
  detail::UniqueFd dir(::open(root.path().c_str(), O_PATH | O_CLOEXEC));
  CHECK_FALSE(remote.fill(dir.get(), "neuronxcc-9.9.9"));
  remote.fill_listing(dir.get());
  remote.neff_opened(dir.get());
  CHECK_FALSE(remote.publishes_writes());
  CHECK(remote.publish_written(root.path().string()).has_value());
  CHECK(remote.promote((root / "tmp").string(), (root / "0123456789abcdef0123456789abcdef").string()).has_value());
  CHECK_FALSE(remote.counters().has_value());
  CHECK_FALSE(test::fs::exists(root / "neuronxcc-9.9.9"));
}

TEST_CASE("a directory store compiles an entry in its backing folder and copies files whole", "[store]") {
  test::TempDir root, out;
  make_entries(root.path());
  auto s = store::DirectoryStore::open(root.path().string());
  CHECK(s->folder() == root.path().string());
  CHECK(s->state_dir() == (root / ".neffcache").string());
  auto done = s->at(k_done);
  REQUIRE(done.has_value());
  auto dest = s->destination(*done);
  REQUIRE(dest.has_value());
  CHECK((*dest)->describe() == (root / k_done).string());
  CHECK((*dest)->files()->done());
  REQUIRE(s->copy_file(*done, "model.neff", (out / "got.neff").string()).has_value());
  CHECK(test::slurp(out / "got.neff") == "neff bytes");
  CHECK_FALSE(s->copy_file(*done, "no-such-file", (out / "none").string()).has_value());
  CHECK_FALSE(fs::exists(out / "none"));
  // A new entry's folder is made for its compile and removed again when left empty.
  auto fresh = s->at("neuronxcc-2.21.0/MODULE_9+4f2d9c1a");
  auto made = s->destination(*fresh);
  REQUIRE((*made)->make().has_value());
  CHECK(fs::is_directory(root / "neuronxcc-2.21.0/MODULE_9+4f2d9c1a"));
  (*made)->unmake();
  CHECK_FALSE(fs::exists(root / "neuronxcc-2.21.0/MODULE_9+4f2d9c1a"));
}
