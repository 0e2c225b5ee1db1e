// neffcache bundle create|import: a manifest's done entries as one file with their
// checksums, imported into a folder or a bucket as a compile's results would be; a
// damaged bundle imports nothing.
#include <filesystem>
#include <string>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/cache/layout.hpp>

#include "s3_support.hpp"
#include "support.hpp"

using namespace neffcache;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

std::string entry_of(int i) { return fmt::format("{}/MODULE_{}+4f2d9c1a", test::k_fake_dir, 5000 + i); }

// A folder cache with `n` entries of distinct corpus graphs, compiled by the fake compiler.
void make_done_cache(const fs::path& root, int n) {
  auto corpus = test::corpus_files();
  for (int i = 0; i < n; ++i) {
    fs::create_directories(root / entry_of(i));
    test::spit(root / entry_of(i) / "compile_flags.json", R"(["--target=trn1"])");
    test::spit(root / entry_of(i) / "model.hlo_module.pb", test::slurp(corpus[static_cast<std::size_t>(i)]));
  }
  auto r = test::run_tool({"compile", "--cache", root.string(), "--compiler", test::k_fake_template});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

void write_manifest(const fs::path& file, const std::vector<std::string>& entries) {
  nlohmann::ordered_json m{{"manifest", 1}, {"bucket", ""}, {"entries", nlohmann::ordered_json::array()}};
  for (const auto& e : entries) m["entries"].push_back({{"entry", e}, {"neff_bytes", 0}});
  test::spit(file, m.dump());
}

}  // namespace

TEST_CASE("a bundle carries a manifest's done entries into a folder and a bucket, checked; a damaged one imports "
          "nothing",
          "[s3][bundle]") {
  test::TempDir dir;
  const fs::path from = dir / "from", manifest = dir / "m.json", bundle = dir / "model.bundle";
  make_done_cache(from, 3);
  fs::create_directories(from / entry_of(3));  // listed, but not done: left out
  test::spit(from / entry_of(3) / "model.hlo_module.pb", "pending");
  write_manifest(manifest, {entry_of(0), entry_of(1), entry_of(2), entry_of(3)});
  auto made = test::run_tool({"bundle", "create", manifest.string(), "--cache", from.string(), "-o", bundle.string()});
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  CHECK_THAT(made.output, ContainsSubstring("3 entries (12 files"));
  CHECK_THAT(made.output, ContainsSubstring("1 not done"));

  SECTION("into a folder: every entry done with the same NEFF, once") {
    const fs::path to = dir / "to";
    fs::create_directories(to);
    auto r = test::run_tool({"bundle", "import", bundle.string(), "--cache", to.string()});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, ContainsSubstring("3 entries imported"));
    for (int i = 0; i < 3; ++i) {
      CHECK(fs::exists(to / entry_of(i) / "model.done"));
      CHECK(test::slurp(to / entry_of(i) / "model.neff") == test::slurp(from / entry_of(i) / "model.neff"));
      CHECK(test::slurp(to / entry_of(i) / "model.hlo_module.pb") ==
            test::slurp(from / entry_of(i) / "model.hlo_module.pb"));
    }
    CHECK_FALSE(fs::exists(to / entry_of(3)));
    // verify trusts what the import recorded.
    CHECK(test::run_tool({"verify", "--cache", to.string()}).exit_code == 0);
    auto again = test::run_tool({"bundle", "import", bundle.string(), "--cache", to.string()});
    CHECK(again.exit_code == 0);
    CHECK_THAT(again.output, ContainsSubstring("0 entries imported into " + to.string() + ", 3 there already"));
  }
  SECTION("an entry that holds another graph is left alone") {
    const fs::path to = dir / "other";
    fs::create_directories(to / entry_of(0));
    test::spit(to / entry_of(0) / "model.hlo_module.pb", test::slurp(test::corpus_files()[7]));
    auto r = test::run_tool({"bundle", "import", bundle.string(), "--cache", to.string()});
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, ContainsSubstring("holds another graph than the bundle's"));
    CHECK_THAT(r.output, ContainsSubstring("2 entries imported"));
    CHECK_FALSE(fs::exists(to / entry_of(0) / "model.neff"));
    CHECK(fs::exists(to / entry_of(1) / "model.done"));
  }
  SECTION("a list that is not one, or none: damaged") {
    test::TempDir fake;
    test::spit(fake / "neffcache-bundle.json", R"({"bundle": "1", "files": []})");
    auto made_bad = test::run({"tar", "--zstd", "-cf", (dir / "list.bundle").string(), "-C", fake.path().string(),
                               "neffcache-bundle.json"});
    if (made_bad.exit_code == 0) {  // (tar with zstd: needs the zstd program)
      auto r = test::run_tool({"bundle", "import", (dir / "list.bundle").string(), "--cache", from.string()});
      test::check_one_line_error(r, "not a neffcache bundle list");
    }
  }
  SECTION("into a bucket: done there, NEFF first and marker last") {
    auto s3 = test::fresh_bucket("bundle");
    const std::string url = fmt::format("s3://{}", s3->bucket());
    auto r = test::run(test::s3_tool_argv({"bundle", "import", bundle.string(), "--cache", url}));
    INFO(r.output);
    CHECK(r.exit_code == 0);
    for (int i = 0; i < 3; ++i) {
      CHECK(s3->get(entry_of(i) + "/model.neff").value() == test::slurp(from / entry_of(i) / "model.neff"));
      CHECK(s3->head(entry_of(i) + "/model.done").has_value());
    }
  }
  SECTION("damaged: a byte changed, or cut short: one line, exit 1, nothing imported") {
    std::string bytes = test::slurp(bundle);
    for (const std::string& bad : {bytes.substr(0, bytes.size() / 2),
                                   bytes.substr(0, bytes.size() / 2) + char(bytes[bytes.size() / 2] ^ 0x55) +
                                       bytes.substr(bytes.size() / 2 + 1)}) {
      test::spit(dir / "bad.bundle", bad);
      const fs::path to = dir / fmt::format("bad-to-{}", bad.size());
      fs::create_directories(to);
      auto r = test::run_tool({"bundle", "import", (dir / "bad.bundle").string(), "--cache", to.string()});
      test::check_one_line_error(r, "nothing imported");
      CHECK(fs::is_empty(to));
    }
  }
}
