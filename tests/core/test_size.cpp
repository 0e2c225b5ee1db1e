// Sizes as users write them on command lines (--max-size, --mem-per-job,
// --local-cache-size) and as the tools print them.
#include <cstdint>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/core/size.hpp>

using namespace neffcache;

TEST_CASE("sizes parse as bytes with binary units in any case", "[size]") {
  CHECK(parse_size("0") == 0u);
  CHECK(parse_size("300") == 300u);
  CHECK(parse_size("300B") == 300u);
  CHECK(parse_size("2kb") == 2048u);
  CHECK(parse_size("2K") == 2048u);
  CHECK(parse_size("512MiB") == 512ull << 20);
  CHECK(parse_size("64G") == 64ull << 30);
  CHECK(parse_size("1t") == 1ull << 40);
  CHECK(parse_size("18446744073709551615") == UINT64_MAX);
  CHECK(parse_size("16777215T") == 16777215ull << 40);  // the largest whole number of TiB
}

TEST_CASE("what is not a size is refused, overflow included", "[size]") {
  for (const char* bad : {"", "G", "-1", "+1", " 1", "1.5G", "12 G", "1P", "1GiBs", "0x10",
                          "18446744073709551616", "16777216T", "99999999999999999999K"})
    CHECK_FALSE(parse_size(bad));
}

TEST_CASE("sizes print in the largest unit below 1024, with one decimal", "[size]") {
  CHECK(format_size(0) == "0 B");
  CHECK(format_size(1023) == "1023 B");
  CHECK(format_size(1024) == "1.0 KiB");
  CHECK(format_size(1536ull << 20) == "1.5 GiB");
  CHECK(format_size(5ull << 50) == "5120.0 TiB");  // TiB is the largest unit
  // What prints is what parses back, for whole units.
  CHECK(parse_size("12MiB") == 12ull << 20);
  CHECK(format_size(*parse_size("12MiB")) == "12.0 MiB");
}
