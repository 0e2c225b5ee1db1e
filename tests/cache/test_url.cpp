#include <map>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/cache/location.hpp>
#include <neffcache/cache/url.hpp>

#include "support.hpp"

using namespace neffcache;
using test::env_of;

TEST_CASE("cache URL precedence: --cache_dir, then NEURON_COMPILE_CACHE_URL, then the default", "[url]") {
  auto resolved = [](std::map<std::string, std::string> vars) {
    auto r = resolve_cache_url(env_of(std::move(vars)));
    REQUIRE(r.has_value());
    return *r;
  };
  CHECK(resolved({}).path == "/var/tmp/neuron-compile-cache");
  CHECK(resolved({{"NEURON_COMPILE_CACHE_URL", "/env/url"}}).path == "/env/url");
  CHECK(resolved({{"NEURON_CC_FLAGS", "-O1 --cache_dir=/flag"}, {"NEURON_COMPILE_CACHE_URL", "/env"}}).path ==
        "/flag");
  CHECK(resolved({{"NEURON_CC_FLAGS", "--cache_dir /spaced -O1"}}).path == "/spaced");
  CHECK(resolved({{"NEURON_CC_FLAGS", "-O1"}, {"NEURON_COMPILE_CACHE_URL", "/env"}}).path == "/env");
  // Empty variables count as unset, as an unset-then-exported shell variable would.
  CHECK(resolved({{"NEURON_CC_FLAGS", ""}, {"NEURON_COMPILE_CACHE_URL", ""}}).path ==
        "/var/tmp/neuron-compile-cache");
  auto s3 = resolved({{"NEURON_COMPILE_CACHE_URL", "s3://my-bucket/team/cache/"}});
  CHECK(s3.is_s3());
  CHECK(s3.bucket == "my-bucket");
  CHECK(s3.prefix == "team/cache");
}

TEST_CASE("s3 and file URLs are parsed; malformed URLs are clear errors", "[url]") {
  auto ok = [](std::string_view url) {
    auto r = parse_cache_url(url);
    REQUIRE(r.has_value());
    return *r;
  };
  CHECK(ok("s3://bucket").prefix.empty());
  CHECK(ok("s3://bucket/").prefix.empty());
  CHECK(ok("s3://b.u-c.k3t/a/b").prefix == "a/b");
  CHECK(ok("file:///var/cache").path == "/var/cache");
  CHECK(ok("relative/dir").path == "relative/dir");
  CHECK_FALSE(ok("/abs").is_s3());

  for (std::string_view bad : {"", "s3://", "s3:///prefix", "s3://ab", "s3://Bucket", "s3://a..b",
                               "s3://-bucket", "s3://bucket/a//b", "s3://bucket/../x", "gs://bucket",
                               "file://relative", "s3://under_score"}) {
    INFO("url: " << bad);
    auto r = parse_cache_url(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::invalid_argument);
    CHECK(r.error().message.find("bad cache URL") == 0);
    CHECK(r.error().message.find('\n') == std::string::npos);
  }
}

TEST_CASE("unsplittable NEURON_CC_FLAGS is an error, not a silent default", "[url]") {
  auto r = resolve_cache_url(env_of({{"NEURON_CC_FLAGS", "--cache_dir='/x"}}));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message == "NEURON_CC_FLAGS: unterminated single quote in flags");
  auto missing = resolve_cache_url(env_of({{"NEURON_CC_FLAGS", "--cache_dir"}}));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().message == "NEURON_CC_FLAGS: --cache_dir needs a value");
}
