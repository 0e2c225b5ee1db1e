// neffcache sync push|pull between a directory cache and a real radosgw bucket.
#include <filesystem>
#include <set>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <neffcache/s3/client.hpp>

#include "s3_support.hpp"
#include "support.hpp"

using namespace neffcache;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

const std::string k_done = "neuronxcc-2.15.128.0+56dc5a86/MODULE_111+4f2d9c1a";
const std::string k_pending = "neuronxcc-2.15.128.0+56dc5a86/MODULE_222+4f2d9c1a";
const std::string k_failed = "neuronxcc-2.15.128.0+56dc5a86/MODULE_333+4f2d9c1a";

// A directory cache with a done, a pending and a failed entry, and the files a sync
// must leave behind: a lock, our private metadata, a stray temporary file.
void make_cache(const fs::path& root) {
  auto hlo = test::slurp(test::corpus_files()[0]);
  test::spit(root / k_done / "model.hlo_module.pb", hlo);
  test::spit(root / k_done / "compile_flags.json", R"(["--target=trn1"])");
  test::spit(root / k_done / "model.neff", std::string(3u << 20, 'N'));
  test::spit(root / k_done / "model.done", "");
  test::spit(root / k_done / ".neffcache-meta.json", "{}");
  test::spit(root / k_pending / "model.hlo_module.pb", hlo + "x");
  test::spit(root / k_pending / "compile_flags.json", "[]");
  test::spit(root / k_pending / "model.hlo_module.pb.lock", "");
  test::spit(root / k_failed / "model.hlo.pb", hlo);
  test::spit(root / k_failed / "model.log", "error: out of memory\n");
  test::spit(root / k_failed / "model.neff.neffcache-tmp.0001", "partial");
}

std::set<std::string> files_under(const fs::path& root) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out.insert(fs::relative(e.path(), root).string());
  return out;
}

// Sets the test server's endpoint and credentials for the tool we start.
struct ToolEnv {
  explicit ToolEnv(const test::S3Env& env = test::S3Env{}) {
    for (const auto& [k, v] : env.vars()) vars.push_back(std::make_unique<test::ScopedEnv>(k.c_str(), v));
  }
  std::vector<std::unique_ptr<test::ScopedEnv>> vars;
};

}  // namespace

TEST_CASE("neffcache sync pushes a directory cache to S3 and pulls it back whole", "[s3][sync]") {
  auto s3 = test::fresh_bucket("sync");
  ToolEnv env;
  test::TempDir src, dst;
  make_cache(src.path());
  std::string url = fmt::format("s3://{}/team/cache", s3->bucket());

  auto push = test::run({test::k_tool, "sync", "push", src.path().string(), url});
  INFO(push.output);
  REQUIRE(push.exit_code == 0);
  CHECK_THAT(push.output, ContainsSubstring("pushed 3 entries: 8 files copied"));
  std::set<std::string> keys, indexed;
  auto listing = s3->list("");
  REQUIRE(listing.has_value());
  for (const auto& o : listing->objects) {
    // The bucket's content index records the done and the failed entry (s3/index.hpp).
    if (o.key.starts_with("team/cache/.neffcache/index/by-entry/")) indexed.insert(o.key.substr(o.key.rfind('/') + 1));
    else if (!o.key.starts_with("team/cache/.neffcache/index/")) keys.insert(o.key);
  }
  CHECK(indexed == std::set<std::string>{k_done.substr(k_done.rfind('/') + 1), k_failed.substr(k_failed.rfind('/') + 1)});
  CHECK(keys == std::set<std::string>{
                    "team/cache/" + k_done + "/model.hlo_module.pb", "team/cache/" + k_done + "/compile_flags.json",
                    "team/cache/" + k_done + "/model.neff", "team/cache/" + k_done + "/model.done",
                    "team/cache/" + k_pending + "/model.hlo_module.pb", "team/cache/" + k_pending + "/compile_flags.json",
                    "team/cache/" + k_failed + "/model.hlo.pb", "team/cache/" + k_failed + "/model.log"});
  auto again = test::run({test::k_tool, "sync", "push", src.path().string(), url});
  CHECK_THAT(again.output, ContainsSubstring("0 files copied (0 bytes), 8 already there"));

  auto pull = test::run({test::k_tool, "sync", "pull", dst.path().string(), url});
  INFO(pull.output);
  REQUIRE(pull.exit_code == 0);
  CHECK_THAT(pull.output, ContainsSubstring("pulled 3 entries: 8 files copied"));
  std::set<std::string> copied = files_under(dst.path());
  CHECK(copied.size() == 8);
  for (const auto& f : copied) CHECK(test::slurp(dst / f) == test::slurp(src / f));
  // The private files and the lock stayed home.
  CHECK_FALSE(copied.contains(k_done + "/.neffcache-meta.json"));
  CHECK_FALSE(copied.contains(k_pending + "/model.hlo_module.pb.lock"));

  // A pulled cache is a working cache: the tool sees the same states.
  auto ls = test::run({test::k_tool, "stats", "--cache", dst.path().string()});
  CHECK(ls.exit_code == 0);
}

TEST_CASE("neffcache sync never writes model.done before its NEFF", "[s3][sync]") {
  auto s3 = test::fresh_bucket("syncdone");
  ToolEnv env;
  test::TempDir dst;
  // A bucket whose entry has model.done but no NEFF (a crashed uploader of another tool).
  REQUIRE(s3->put(k_done + "/model.hlo_module.pb", "hlo").has_value());
  REQUIRE(s3->put(k_done + "/model.done", "").has_value());
  auto pull = test::run({test::k_tool, "sync", "pull", dst.path().string(), fmt::format("s3://{}", s3->bucket())});
  REQUIRE(pull.exit_code == 0);
  CHECK(fs::exists(dst / k_done / "model.hlo_module.pb"));
  CHECK_FALSE(fs::exists(dst / k_done / "model.done"));
}

TEST_CASE("neffcache sync refuses bad input with one line", "[s3][sync]") {
  test::TempDir dir;
  SECTION("not an S3 URL") {
    test::check_one_line_error(test::run({test::k_tool, "sync", "push", dir.path().string(), "/var/tmp/x"}),
                               "needs an s3:// URL");
  }
  SECTION("a wrong secret") {
    auto bucket = test::fresh_bucket("syncsecret")->bucket();
    ToolEnv env(test::S3Env(std::map<std::string, std::string>{{"AWS_SECRET_ACCESS_KEY", "wrong"}}));
    test::check_one_line_error(
        test::run({test::k_tool, "sync", "pull", dir.path().string(), fmt::format("s3://{}", bucket)}),
        "SignatureDoesNotMatch");
    CHECK(fs::is_empty(dir.path()));
  }
  SECTION("no such bucket") {
    ToolEnv env;
    test::check_one_line_error(
        test::run({test::k_tool, "sync", "pull", dir.path().string(), "s3://no-such-bucket-here"}), "NoSuchBucket");
  }
}
