#include <fcntl.h>
#include <sys/stat.h>

#include <map>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>

#include "support.hpp"

using namespace neffcache;

namespace {

// Creates `names` (empty files) in <root>/<compiler>/<module>.
test::fs::path make_layout_entry(const test::fs::path& root, const std::string& rel,
                          std::initializer_list<std::string_view> names) {
  auto dir = root / rel;
  test::fs::create_directories(dir);
  for (auto n : names) test::touch(dir / std::string(n));
  return dir;
}

void age(const test::fs::path& p, std::chrono::seconds by) {
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = ::time(nullptr) - by.count();
  ts[0].tv_nsec = ts[1].tv_nsec = 0;
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), ts, 0) == 0);
}

std::map<std::string, EntryState> walk_states(const test::fs::path& root) {
  std::map<std::string, EntryState> out;
  auto r = for_each_entry(root.string(), [&](const EntryRef& e) {
    CHECK(out.emplace(e.relative_path(), entry_state(e)).second);
  });
  REQUIRE(r.has_value());
  return out;
}

}  // namespace

TEST_CASE("entry keys name the Neuron layout", "[layout]") {
  EntryKey k{"2.21.0", "0123456789abcdef0123", "e30acd3a"};
  CHECK(k.compiler_dir() == "neuronxcc-2.21.0");
  CHECK(k.module_dir() == "MODULE_0123456789abcdef0123+e30acd3a");
  CHECK(k.relative_path() == "neuronxcc-2.21.0/MODULE_0123456789abcdef0123+e30acd3a");
  CHECK(check_compiler_version("2.15.128.0+56dc5a86").has_value());
  for (std::string_view bad : {"", ".", "..", "a/b", "with space"}) CHECK_FALSE(check_compiler_version(bad));
}

TEST_CASE("an entry path is neuronxcc-*/MODULE_* and nothing that could leave the cache", "[layout]") {
  for (std::string_view good : {"neuronxcc-2.21.0/MODULE_1+aa", "neuronxcc-2.15.128.0+56dc5a86/MODULE_0123+e30acd3a",
                                "neuronxcc-/MODULE_"})
    CHECK(is_entry_path(good));
  for (std::string_view bad : {"", "MODULE_1+aa", "neuronxcc-2.21.0", "neuronxcc-2.21.0/", "neuronxcc-2.21.0//MODULE_1",
                               "neuronxcc-2.21.0/MODULE_1/model.neff", "/neuronxcc-2.21.0/MODULE_1",
                               "other-2.21.0/MODULE_1", "neuronxcc-2.21.0/module_1", "neuronxcc-../MODULE_1",
                               "neuronxcc-2.21.0/MODULE_../../etc", "neuronxcc-2/MODULE_a..b"})
    CHECK_FALSE(is_entry_path(bad));
}

TEST_CASE("an entry folder in a cache folder is named by its entry path there", "[layout]") {
  const std::string lnl_key = "0123456789abcdef0123456789abcdef";
  CHECK(entry_path_in("/c", "/c/neuronxcc-2.21.0/MODULE_1+aa") == "neuronxcc-2.21.0/MODULE_1+aa");
  CHECK(entry_path_in("/c", "/c/" + lnl_key) == lnl_key);
  for (std::string_view not_in : {"/c", "/c/", "/cc/neuronxcc-2.21.0/MODULE_1+aa", "/d/neuronxcc-2.21.0/MODULE_1+aa",
                                  "/c/neuronxcc-2.21.0", "/c/neuronxcc-2.21.0/MODULE_1+aa/model.neff",
                                  "/c/.neffcache/index", "/c//neuronxcc-2.21.0/MODULE_1+aa"})
    CHECK_FALSE(entry_path_in("/c", not_in));
}

TEST_CASE("an entry folder's name is MODULE_* or an LNL key; a compiler's folder is neuronxcc-<version>", "[layout]") {
  for (std::string_view good : {"MODULE_1+aa", "MODULE_", "0123456789abcdef0123456789abcdef"}) CHECK(is_entry_folder(good));
  for (std::string_view bad : {"", "module_1", "neuronxcc-2.21.0", "model.neff", "0123456789ABCDEF0123456789abcdef",
                               "0123456789abcdef0123456789abcde", ".neffcache"})
    CHECK_FALSE(is_entry_folder(bad));
  CHECK(compiler_dir_name("2.21.0") == "neuronxcc-2.21.0");
  CHECK(is_entry_path(compiler_dir_name("2.15.128.0+56dc5a86") + "/MODULE_1+aa"));
}

TEST_CASE("an entry's compiler folder is the one before its MODULE_ folder; an LNL entry has none", "[layout]") {
  CHECK(compiler_dir_of("/c/neuronxcc-2.15.128.0+56dc5a86/MODULE_1+2") == "neuronxcc-2.15.128.0+56dc5a86");
  CHECK(compiler_dir_of("neuronxcc-2.21.0/MODULE_1+2") == "neuronxcc-2.21.0");
  CHECK(compiler_dir_of("s3://b/p/neuronxcc-2.21.0/MODULE_1+2/") == "neuronxcc-2.21.0");
  CHECK(compiler_dir_of("/c/0123456789abcdef0123456789abcdef").empty());
  CHECK(compiler_dir_of("MODULE_1+2").empty());
}

TEST_CASE("an LNL NEFF's name gives back its key; no other name gives one", "[layout]") {
  const std::string key = "0123456789abcdef0123456789abcdef";
  CHECK(lnl_neff_key(lnl_neff_name(key)) == key);
  for (std::string_view other : {"model.neff", "graph_.neff", "graph_0123.neff", "graph_0123456789ABCDEF0123456789abcdef.neff",
                                 "graph_0123456789abcdef0123456789abcdef.neff.tmp", "xgraph_0123456789abcdef0123456789abcdef.neff",
                                 "graph_0123456789abcdef0123456789abcdefneff", ""})
    CHECK_FALSE(lnl_neff_key(other));
}

TEST_CASE("an LNL key's lock name gives back its key; no other name gives one", "[layout]") {
  const std::string key = "0123456789abcdef0123456789abcdef";
  CHECK(lnl_lock_key(lnl_lock_name(key)) == key);
  for (const std::string& other : std::vector<std::string>{
           lnl_holder_name(key), key, ".compilation_metadata.lock", ".0123.compilation_metadata.lock",
           "x.0123456789abcdef0123456789abcdef.compilation_metadata.lock", "model.hlo_module.pb.lock", ""})
    CHECK_FALSE(lnl_lock_key(other));
}

TEST_CASE("an entry's state follows from its files", "[layout]") {
  using F = EntryFile;
  auto state = [](std::initializer_list<F> files, bool live = true) {
    EntryFiles f;
    for (auto x : files) f.add(x);
    return classify(f, [&] { return live; });
  };
  CHECK(state({}) == EntryState::empty);
  CHECK(state({F::hlo_module}) == EntryState::pending);
  CHECK(state({F::hlo_legacy, F::flags}) == EntryState::pending);
  CHECK(state({F::hlo_module, F::neff, F::done}) == EntryState::done);
  CHECK(state({F::neff, F::done}) == EntryState::done);
  // A product without the rest: a leftover (or our publish interrupted: record.hpp tells).
  CHECK(state({F::hlo_module, F::neff}) == EntryState::partial);
  CHECK(state({F::hlo_module, F::done}) == EntryState::partial);
  CHECK(state({F::hlo_module, F::neff, F::log}) == EntryState::partial);
  CHECK(state({F::hlo_module, F::done, F::log}) == EntryState::failed);
  CHECK(state({F::hlo_module, F::log}) == EntryState::failed);
  CHECK(state({F::hlo_module, F::lock_module}) == EntryState::compiling);
  CHECK(state({F::hlo_module, F::lock_module}, false) == EntryState::stale_lock);
  CHECK(state({F::hlo_legacy, F::lock_legacy, F::log}) == EntryState::compiling);  // a retry runs
  CHECK(state({F::hlo_module, F::neff, F::done, F::lock_module}, false) == EntryState::done);

  EntryFiles legacy;
  legacy.add(F::hlo_legacy);
  CHECK(legacy.hlo_name() == "model.hlo.pb");
  CHECK(legacy.lock_name() == "model.hlo.pb.lock");
  EntryFiles both;
  both.add(F::hlo_legacy);
  both.add(F::hlo_module);
  CHECK(both.hlo_name() == "model.hlo_module.pb");
  CHECK(both.lock_name() == "model.hlo_module.pb.lock");
  CHECK(EntryFiles{}.lock_name() == "model.hlo_module.pb.lock");
  for (auto s : {EntryState::empty, EntryState::pending, EntryState::compiling, EntryState::done,
                 EntryState::failed, EntryState::stale_lock})
    CHECK(parse_entry_state(to_string(s)) == s);
}

TEST_CASE("the walk finds every entry with its state and nothing else", "[layout]") {
  test::TempDir root;
  const std::string c = "neuronxcc-2.21.0/";
  make_layout_entry(root.path(), c + "MODULE_a+1", {"model.hlo_module.pb", "compile_flags.json"});
  make_layout_entry(root.path(), c + "MODULE_b+1", {"model.hlo.pb"});
  make_layout_entry(root.path(), c + "MODULE_c+1", {"model.hlo_module.pb", "model.neff", "model.done"});
  make_layout_entry(root.path(), c + "MODULE_d+1", {"model.hlo_module.pb", "model.log"});
  make_layout_entry(root.path(), c + "MODULE_e+1", {"model.hlo_module.pb", "model.hlo_module.pb.lock"});
  auto stale = make_layout_entry(root.path(), c + "MODULE_f+1", {"model.hlo.pb", "model.hlo.pb.lock"});
  age(stale / "model.hlo.pb.lock", k_anonymous_lock_stale_after + std::chrono::seconds(60));
  make_layout_entry(root.path(), c + "MODULE_g+1", {});
  make_layout_entry(root.path(), "neuronxcc-2.12.0/MODULE_h+2", {"model.hlo.pb", "model.neff"});
  // Not entries: other folders, files where folders belong, our private folders.
  make_layout_entry(root.path(), c + "not_a_module", {"model.hlo_module.pb"});
  make_layout_entry(root.path(), "other-tree/MODULE_x+1", {"model.hlo_module.pb"});
  make_layout_entry(root.path(), c + ".neffcache-tmp", {"model.hlo_module.pb"});
  test::spit(root / "lock", "");
  test::spit(root.path() / c / "MODULE_file+1", "");
  // A symlinked compiler tree is not followed: it could lead outside the root.
  test::TempDir outside;
  make_layout_entry(outside.path(), "MODULE_out+1", {"model.hlo_module.pb"});
  test::fs::create_directory_symlink(outside.path(), root / "neuronxcc-9.9.9");

  auto states = walk_states(root.path());
  std::map<std::string, EntryState> expected{
      {c + "MODULE_a+1", EntryState::pending},   {c + "MODULE_b+1", EntryState::pending},
      {c + "MODULE_c+1", EntryState::done},      {c + "MODULE_d+1", EntryState::failed},
      {c + "MODULE_e+1", EntryState::compiling}, {c + "MODULE_f+1", EntryState::stale_lock},
      {c + "MODULE_g+1", EntryState::empty},     {"neuronxcc-2.12.0/MODULE_h+2", EntryState::partial},
  };
  CHECK(states == expected);

  SECTION("read_entry_files sees the same files as the walk") {
    auto f = read_entry_files((root.path() / c / "MODULE_a+1").string());
    REQUIRE(f.has_value());
    CHECK(f->has(EntryFile::hlo_module));
    CHECK(f->has(EntryFile::flags));
    CHECK_FALSE(f->has(EntryFile::neff));
    auto missing = read_entry_files((root.path() / c / "MODULE_zz+1").string());
    REQUIRE_FALSE(missing.has_value());
    CHECK(missing.error().code == Errc::not_found);
  }
}

TEST_CASE("a missing or unreadable root is an error; an empty root has no entries", "[layout]") {
  test::TempDir root;
  auto r = for_each_entry((root / "absent").string(), [](const EntryRef&) { FAIL("no entries"); });
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::not_found);
  CHECK(r.error().message.find("absent") != std::string::npos);
  int n = 0;
  REQUIRE(for_each_entry(root.path().string(), [&](const EntryRef&) { ++n; }).has_value());
  CHECK(n == 0);
}

TEST_CASE("the walk handles thousands of entries in one pass", "[layout]") {
  test::TempDir root;
  constexpr int k_entries = 3000;
  for (int i = 0; i < k_entries; ++i)
    make_layout_entry(root.path(), fmt::format("neuronxcc-1/MODULE_{}+0", i),
               {i % 3 ? "model.hlo_module.pb" : "model.neff", "model.done"});
  int pending = 0, done = 0;
  REQUIRE(for_each_entry(root.path().string(), [&](const EntryRef& e) {
            (entry_state(e) == EntryState::done ? done : pending)++;
          }).has_value());
  CHECK(done == k_entries / 3);
  CHECK(pending == k_entries - k_entries / 3);
}
