// Replays the fuzz targets' inputs under the test suite's build (and so under ASan and
// UBSan in CI): every seed, the HLO corpus, and every input a fuzzer found
// (fuzz/found/TARGET/), so that what was once found stays fixed.
#include <functional>

#include <catch2/catch_test_macros.hpp>

#include "fuzz/targets.hpp"
#include "support.hpp"

namespace {

const test::fs::path k_fuzz = test::path::fuzz;

// The files of the given folders that exist, sorted.
std::vector<test::fs::path> inputs(std::initializer_list<test::fs::path> dirs) {
  std::vector<test::fs::path> out;
  for (const auto& d : dirs)
    if (test::fs::is_directory(d))
      for (const auto& f : test::fs::directory_iterator(d))
        if (f.is_regular_file()) out.push_back(f.path());
  std::sort(out.begin(), out.end());
  return out;
}

void replay(const std::string& target, const std::function<void(std::string_view)>& run) {
  auto files = inputs({k_fuzz / "seeds" / target, k_fuzz / "found" / target});
  if (target == "hlo") {
    auto corpus = test::corpus_files();
    files.insert(files.end(), corpus.begin(), corpus.end());
  }
  REQUIRE(files.size() >= 4);
  for (const auto& f : files) {
    INFO(f.string());
    run(test::slurp(f));  // a violated property aborts the test binary
  }
}

}  // namespace

TEST_CASE("the fuzz targets hold on every seed and every input a fuzzer found", "[fuzz]") {
  replay("hlo", neffcache::fuzz::hlo);
  replay("neuron_cc_flags", neffcache::fuzz::neuron_cc_flags);
  replay("compile_flags_json", neffcache::fuzz::compile_flags_json);
  replay("compiler_template", neffcache::fuzz::compiler_template);
  replay("s3_answer", neffcache::fuzz::s3_answer);
}

TEST_CASE("the flags round trip skips only lists that are not UTF-8", "[fuzz]") {
  CHECK(neffcache::fuzz::valid_utf8("caf\xc3\xa9 \xf0\x9f\x98\x80"));
  CHECK_FALSE(neffcache::fuzz::valid_utf8("caf\xe9"));
  CHECK_FALSE(neffcache::fuzz::valid_utf8("\xed\xa0\x80"));  // a surrogate
}
