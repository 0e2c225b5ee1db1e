// The store interface on an S3 cache and on the local tier of one (store/s3.hpp,
// store/tier.hpp), against the test radosgw: listing states, naming entries from every
// accepted form, maintenance under leases, and the refusals.
#include <fcntl.h>

#include <filesystem>
#include <map>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <neffcache/store/open.hpp>
#include <neffcache/store/s3.hpp>
#include <neffcache/store/tier.hpp>

#include "s3_support.hpp"
#include "support.hpp"
#include "store_support.hpp"

using namespace neffcache;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

constexpr int k_first = 900;  // fake_entry numbers of this file

// Entries 0..3 of this file under `prefix`: pending, done, failed, done with an empty NEFF.
void make_entries(S3Client& s3, const std::string& prefix) {
  test::put_pending_entries(s3, prefix, 4, k_first);
  auto base = [&](int i) { return s3_key(prefix, test::fake_entry(i, k_first)); };
  REQUIRE(s3.put(base(1) + "/model.neff", "neff bytes").has_value());
  REQUIRE(s3.put(base(1) + "/model.done", "").has_value());
  REQUIRE(s3.put(base(2) + "/model.log", "it failed").has_value());
  REQUIRE(s3.put(base(3) + "/model.neff", "").has_value());
  REQUIRE(s3.put(base(3) + "/model.done", "").has_value());
}

std::unique_ptr<store::Store> open(const std::string& url) {
  auto s = store::open_store(url, test::S3Env{}.lookup());
  INFO((s ? "" : s.error().message));
  REQUIRE(s.has_value());
  return std::move(*s);
}

}  // namespace

TEST_CASE("an S3 store lists every entry with its state", "[s3][store]") {
  auto s3 = test::fresh_bucket("store-list");
  make_entries(*s3, "p");
  const std::string url = fmt::format("s3://{}/p", s3->bucket());
  auto s = open(url);
  CHECK(s->name() == url);
  CHECK(test::entry_states(*s) == std::map<std::string, EntryState>{{test::fake_entry(0, k_first), EntryState::pending},
                                                        {test::fake_entry(1, k_first), EntryState::done},
                                                        {test::fake_entry(2, k_first), EntryState::failed},
                                                        {test::fake_entry(3, k_first), EntryState::done}});
  CHECK_FALSE(s->compiles_on_open());
  CHECK_FALSE(s->copies_equal_graphs());
  CHECK(s->compile_function());
  // No folder of its own; a compile of an entry goes under its lease; a file is
  // downloaded whole.
  CHECK_FALSE(s->folder().has_value());
  CHECK(s->state_dir().ends_with("/.cache/neffcache"));
  auto done = s->at(test::fake_entry(1, k_first));
  REQUIRE(done.has_value());
  auto dest = s->destination(*done);
  REQUIRE(dest.has_value());
  REQUIRE((*dest)->files().has_value());
  CHECK((*dest)->files()->done());
  test::TempDir out;
  REQUIRE(s->copy_file(*done, "model.neff", (out / "got.neff").string()).has_value());
  CHECK(test::slurp(out / "got.neff") == "neff bytes");
  // Verification without a publication record: present and not empty.
  auto entries = s->list();
  REQUIRE(entries.has_value());
  for (const auto& e : *entries) {
    if (e.path == test::fake_entry(1, k_first)) CHECK(s->verify(e).check == NeffCheck::unrecorded);
    if (e.path == test::fake_entry(3, k_first)) CHECK(s->verify(e).why == "model.neff is empty");
  }
  // A store without folders has none to give or tidy.
  auto folder = s->of_folder("/tmp/neuronxcc-2.21.0/MODULE_1+4f2d9c1a");
  REQUIRE_FALSE(folder.has_value());
  CHECK_THAT(folder.error().message, ContainsSubstring("has no local folders"));
  s->remove_empty_compiler_dirs({"neuronxcc-2.21.0"});
}

TEST_CASE("an S3 store names an entry by its path in the cache or its URL", "[s3][store]") {
  auto s3 = test::fresh_bucket("store-names");
  make_entries(*s3, "p");
  const std::string url = fmt::format("s3://{}/p", s3->bucket());
  auto s = open(url);
  const std::string rel = test::fake_entry(1, k_first);
  for (const std::string& arg : {rel, rel + "/", url + "/" + rel, url + "/" + rel + "/"}) {
    INFO(arg);
    auto e = s->named(arg);
    REQUIRE(e.has_value());
    CHECK(e->path() == rel);
    CHECK(e->view() == url + "/" + rel);
  }
  // A file of the entry names it only where a file may be given (graph extraction lines).
  auto file = s->named(url + "/" + rel + "/model.hlo_module.pb");
  REQUIRE_FALSE(file.has_value());
  CHECK_THAT(file.error().message,
             ContainsSubstring("not an entry of " + url + " (give neuronxcc-*/MODULE_*, or an LNL key)"));
  auto by_file = s->named_by_file(url + "/" + rel + "/model.hlo_module.pb");
  REQUIRE(by_file.has_value());
  CHECK(by_file->path() == rel);
  // An LNL entry: its key, as a path or in its URL, or a file of it.
  const std::string key = "0123456789abcdef0123456789abcdef";
  for (const std::string& arg : {key, url + "/" + key, url + "/" + key + "/"}) {
    INFO(arg);
    auto e = s->named(arg);
    REQUIRE(e.has_value());
    CHECK(e->path() == key);
    CHECK(e->dialect() == Dialect::lnl);
    auto f = s->named_by_file(arg);
    REQUIRE(f.has_value());
    CHECK(f->path() == key);
  }
  auto lnl_file = s->named_by_file(url + "/" + key + "/graph.hlo");
  REQUIRE(lnl_file.has_value());
  CHECK(lnl_file->path() == key);
  auto bare = s->named("MODULE_1+4f2d9c1a");
  REQUIRE_FALSE(bare.has_value());
  CHECK(bare.error().code == Errc::invalid_argument);
  CHECK_FALSE(s->named(fmt::format("s3://{}/other/{}", s3->bucket(), rel)).has_value());

  // Without a prefix, entries sit at the bucket's top.
  auto top = open(fmt::format("s3://{}", s3->bucket()));
  CHECK(top->view(*top->at(rel)) == fmt::format("s3://{}/{}", s3->bucket(), rel));
}

TEST_CASE("an S3 store's maintenance and reads", "[s3][store]") {
  auto s3 = test::fresh_bucket("store-maint");
  make_entries(*s3, "p");
  auto s = open(fmt::format("s3://{}/p", s3->bucket()));
  auto entry = [&](int i) { return *s->at(test::fake_entry(i, k_first)); };

  auto cleared = s->clear_failure(entry(2));
  REQUIRE(cleared.has_value());
  CHECK(*cleared);
  cleared = s->clear_failure(entry(2));
  REQUIRE(cleared.has_value());
  CHECK_FALSE(*cleared);

  std::string copy;
  {
    auto neff = s->local_file(entry(1), "model.neff");
    REQUIRE(neff.has_value());
    copy = neff->path();
    CHECK(test::slurp(copy) == "neff bytes");
  }
  CHECK_FALSE(fs::exists(copy));  // the downloaded copy went with its LocalFile
  auto files = s->files(entry(1));
  REQUIRE(files.has_value());
  CHECK(files->done());

  REQUIRE(s->clear_results(entry(1)).has_value());
  REQUIRE(s->remove(entry(0)).has_value());
  auto now = test::entry_states(*s);
  CHECK(now.size() == 3);
  CHECK(now[test::fake_entry(1, k_first)] == EntryState::pending);
  CHECK(now[test::fake_entry(2, k_first)] == EntryState::pending);

  auto put = s->put_graph(*s->at("neuronxcc-2.21.0/MODULE_999+4f2d9c1a"), "hlo", {"--target=trn1"});
  REQUIRE(put.has_value());
  CHECK(*put);
  put = s->put_graph(*s->at("neuronxcc-2.21.0/MODULE_999+4f2d9c1a"), "hlo", {"--target=trn1"});
  REQUIRE(put.has_value());
  CHECK_FALSE(*put);
}

TEST_CASE("a tier store sees S3 entries in its local folder", "[s3][store]") {
  auto s3 = test::fresh_bucket("store-tier");
  make_entries(*s3, "p");
  const std::string url = fmt::format("s3://{}/p", s3->bucket());
  test::TempDir local;
  auto parsed = parse_cache_url(url);
  REQUIRE(parsed.has_value());
  S3Tier::Options o;
  o.root = local.path().string();
  auto t = store::TierStore::open(*parsed, o, test::S3Env{}.lookup());
  REQUIRE(t.has_value());
  auto& tier = **t;
  CHECK(tier.name() == url);
  CHECK(test::entry_states(tier).size() == 4);  // S3's listing is the truth
  const store::Remote& remote = tier.remote();
  CHECK(remote.publishes_writes());
  CHECK_FALSE(tier.copies_equal_graphs());

  const std::string rel = test::fake_entry(1, k_first);
  const std::string compiler = rel.substr(0, rel.find('/'));
  // A lookup in the local folder brings the compiler folder, then the entry's inputs.
  auto folder = [](const std::string& path) { return detail::UniqueFd(::open(path.c_str(), O_PATH | O_CLOEXEC)); };
  CHECK(remote.fill(folder(tier.root()).get(), compiler));
  CHECK(remote.fill(folder(tier.root() + "/" + compiler).get(), rel.substr(rel.find('/') + 1)));
  CHECK(fs::exists(local.path() / rel / "model.hlo_module.pb"));
  auto e = tier.named((local.path() / rel / "model.hlo_module.pb").string());
  REQUIRE(e.has_value());
  CHECK(e->path() == rel);
  CHECK(e->view() == (local.path() / rel).string());
  auto by_url = tier.named(url + "/" + rel);
  REQUIRE(by_url.has_value());
  CHECK(*by_url == *e);
  auto of = tier.of_folder((local.path() / rel).string());
  REQUIRE(of.has_value());
  CHECK(*of == *e);
  REQUIRE_FALSE(tier.of_folder(local.path().string()).has_value());

  // Settling the done entry fetches its NEFF into the local folder.
  auto r = tier.compile_function()(e->view(), CompileSettings{});
  CHECK(r.outcome == CompileOutcome::already_done);
  CHECK(test::slurp(local.path() / rel / "model.neff") == "neff bytes");
  REQUIRE(remote.counters().has_value());
  CHECK((*remote.counters())["fetches"] == 1);
  // Clearing results clears them on S3 and here.
  REQUIRE(tier.clear_results(*e).has_value());
  CHECK_FALSE(fs::exists(local.path() / rel / "model.neff"));
  CHECK(test::entry_states(tier)[rel] == EntryState::pending);
}
