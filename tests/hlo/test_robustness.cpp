// Hostile bytes: every answer is an error or a valid result, never a crash or an
// out-of-bounds read (the suite also runs under ASan and UBSan).
#include <random>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/hlo/hlo.hpp>

#include "hlo_subset.pb.h"
#include "support.hpp"

using namespace neffcache;

namespace {

// Files up to this size are cut at every byte; larger ones at every byte of their
// first and last 2 KiB and at 400 places between (every cut costs a parse of the prefix).
// Files over 256 KiB, at every byte of their last 32 only: a cut in the last fields parses
// nearly the whole file (the 1.3 MB corpus file: 60 ms a cut at -O0, 9.1 of the case's 15 s,
// and the case took 116 s under ASan), and the cuts between still reach every part of it.
constexpr std::size_t k_every_cut_limit = 20 * 1024;
constexpr std::size_t k_edge = 2048;
constexpr std::size_t k_large = 256 * 1024, k_large_tail = 32;
constexpr int k_middle_cuts = 400;

// Returns true for a valid result. Errors must be bad_hlo with a one-line message.
bool probe(std::string_view bytes) {
  auto r = analyze_hlo(bytes);
  if (r) return true;
  CHECK(r.error().code == Errc::bad_hlo);
  CHECK(r.error().message.find('\n') == std::string::npos);
  return false;
}

}  // namespace

TEST_CASE("every truncation of a corpus file is an error or a valid result", "[hlo][robustness]") {
  int errors = 0, cuts = 0;
  for (const auto& f : test::corpus_files()) {
    INFO(f.filename());
    const std::string bytes = test::slurp(f);
    std::vector<std::size_t> at;
    if (bytes.size() <= k_every_cut_limit) {
      for (std::size_t n = 0; n < bytes.size(); ++n) at.push_back(n);
    } else {
      const std::size_t tail = bytes.size() > k_large ? k_large_tail : k_edge;
      for (std::size_t n = 0; n < k_edge; ++n) at.push_back(n);
      for (std::size_t n = 0; n < tail; ++n) at.push_back(bytes.size() - 1 - n);
      for (int k = 1; k <= k_middle_cuts; ++k) at.push_back(bytes.size() * k / (k_middle_cuts + 1));
    }
    for (std::size_t n : at) {
      // A fresh heap copy of exactly n bytes, so ASan sees any read past the end.
      std::string prefix(bytes.data(), n);
      errors += !probe(prefix);
      ++cuts;
    }
  }
  // Nearly every cut lands inside a field; the few that end on a field boundary of a
  // complete module may parse (a shorter module is still a module).
  CHECK(errors > cuts * 9 / 10);
}

TEST_CASE("random byte flips are an error or a valid result", "[hlo][robustness]") {
  std::mt19937_64 rng(20261121);
  for (const auto& f : test::corpus_files()) {
    INFO(f.filename());
    const std::string bytes = test::slurp(f);
    int flips = bytes.size() > 200'000 ? 40 : 300;
    for (int i = 0; i < flips; ++i) {
      std::string mutated = bytes;
      int changes = 1 + static_cast<int>(rng() % 4);
      for (int c = 0; c < changes; ++c)
        mutated[rng() % mutated.size()] = static_cast<char>(rng() & 0xff);
      probe(mutated);
    }
  }
}

TEST_CASE("bytes that are not HLO are rejected with a clear error", "[hlo][robustness]") {
  auto rejected = [](std::string_view bytes) {
    auto r = analyze_hlo(bytes);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::bad_hlo);
    return r.error().message;
  };
  CHECK(rejected("") == "empty file, not an HLO module");
  CHECK(rejected("[\"--target=trn1\"]").find("not a readable HLO module") == 0);
  CHECK(rejected("HloModule jit_f, entry_computation_layout={}\n\nENTRY main { }\n")
            .find("not a readable HLO module") == 0);
  CHECK_FALSE(rejected(std::string(64, '\0')).empty());
  CHECK_FALSE(rejected(std::string(1000, '\xff')).empty());

  // Valid protobuf that is not HLO: a stack frame table, and a module with no computations.
  neffcache_test::StackFrameIndexProto frames;
  frames.add_file_names("/a.py");
  frames.add_function_names("f");
  CHECK_FALSE(rejected(frames.SerializeAsString()).empty());
  neffcache_test::HloModuleProto empty;
  empty.set_name("no_computations");
  CHECK(rejected(empty.SerializeAsString()).find("module without computations") != std::string::npos);

  // An instruction whose opcode is binary garbage.
  neffcache_test::HloModuleProto odd;
  odd.add_computations()->add_instructions()->set_opcode(std::string("\x01\x02", 2));
  CHECK(rejected(odd.SerializeAsString()).find("opcode") != std::string::npos);

  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string junk(1 + rng() % 512, '\0');
    for (auto& c : junk) c = static_cast<char>(rng() & 0xff);
    probe(junk);
  }
}

TEST_CASE("deeply nested input is refused, not a stack overflow", "[hlo][robustness]") {
  auto wrap = [](uint32_t field, const std::string& payload) {
    std::string out(1, static_cast<char>(field << 3 | 2));
    for (uint64_t n = payload.size();; n >>= 7) {
      out.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
      if (n <= 0x7f) break;
    }
    return out + payload;
  };
  // A parameter whose shape is a tuple of a tuple of ... 5,000 levels deep.
  std::string shape;
  for (int depth = 0; depth < 5000; ++depth) shape = wrap(4, shape);
  neffcache_test::ShapeProto parsed;  // protobuf's own parser refuses this depth too
  CHECK_FALSE(parsed.ParseFromString(shape));
  std::string instr = wrap(2, "parameter") + wrap(3, shape);
  auto r = analyze_hlo(wrap(3, wrap(2, instr)));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message.find("nested deeper than 64") != std::string::npos);
}
