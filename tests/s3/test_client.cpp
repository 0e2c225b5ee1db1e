// The S3 client: SigV4 against AWS's published example, configuration and credentials
// from the environment, and every operation against a real radosgw.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <map>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/record.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/detail/sigv4.hpp>
#include <neffcache/s3/client.hpp>

#include "s3_support.hpp"
#include "support.hpp"

using namespace neffcache;
using test::env_of;
using Catch::Matchers::ContainsSubstring;

namespace {


// Bytes that differ at every offset, so a part out of place or a lost chunk shows.
std::string pattern(std::size_t size) {
  std::string out(size, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < size; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    out[i] = static_cast<char>(x);
  }
  return out;
}

// A client of the test server with small multipart sizes and quick retries.
std::unique_ptr<S3Client> client_with(const std::string& bucket, S3Settings tweak) {
  const auto& s = test::s3_server();
  tweak.endpoint = s.endpoint;
  return std::make_unique<S3Client>(bucket, tweak, S3Credentials{s.access_key, s.secret_key, "", {}, "test"});
}

}  // namespace

TEST_CASE("SigV4 signs AWS's GET Object example", "[s3]") {
  // The example of AWS's "Signature Calculations for the Authorization Header" page.
  std::string auth = detail::sigv4_authorization(
      {"GET",
       "/test.txt",
       "",
       {{"Host", "examplebucket.s3.amazonaws.com"},
        {"Range", "bytes=0-9"},
        {"x-amz-content-sha256", std::string(detail::k_empty_sha256)},
        {"x-amz-date", "20130524T000000Z"}},
       detail::k_empty_sha256},
      {"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1", "20130524T000000Z"});
  CHECK(auth ==
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST_CASE("the canonical query is sorted and percent-encoded", "[s3]") {
  CHECK(detail::canonical_query({{"prefix", "a b/c+d"}, {"list-type", "2"}}) == "list-type=2&prefix=a%20b%2Fc%2Bd");
  CHECK(detail::canonical_query({{"uploads", ""}}) == "uploads=");
  CHECK(detail::uri_encode("neuronxcc-2.1/MODULE_1+2/model.neff", true) ==
        "neuronxcc-2.1/MODULE_1%2B2/model.neff");
}

TEST_CASE("dates in S3 answers are read, and absurd ones are refused", "[s3]") {
  using std::chrono::system_clock;
  auto t = detail::parse_http_date("Sun, 22 Nov 2026 20:15:12 GMT");
  CHECK(system_clock::to_time_t(t) == 1795378512);
  CHECK(detail::parse_iso8601("2026-11-22T20:15:12.000Z") == t);
  // Year 2497 would overflow the clock's nanoseconds (found by the s3_answer fuzzer).
  CHECK(detail::parse_http_date("Sun, 22 Nov 2497 20:16:12 GMT") == system_clock::time_point{});
  CHECK(detail::parse_iso8601("1969-12-31T23:59:59Z") == system_clock::time_point{});
  CHECK(detail::parse_http_date("yesterday") == system_clock::time_point{});
}

TEST_CASE("S3 settings come from the environment as the AWS tools read it", "[s3]") {
  SECTION("AWS by default: virtual-host addressing in the region") {
    auto s = s3_settings_from_env("cache-bucket", env_of({{"AWS_DEFAULT_REGION", "eu-west-1"}}));
    REQUIRE(s.has_value());
    CHECK(s->endpoint == "https://s3.eu-west-1.amazonaws.com");
    CHECK(s->region == "eu-west-1");
    CHECK_FALSE(s->path_style);
    // A dotted bucket name cannot match the TLS certificate as a host name.
    CHECK(s3_settings_from_env("my.bucket", env_of({}))->path_style);
  }
  SECTION("the S3 endpoint variable wins over the general one; path-style then") {
    auto s = s3_settings_from_env("b00", env_of({{"AWS_ENDPOINT_URL", "http://general:1"},
                                                 {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:7480/"},
                                                 {"AWS_REGION", "r1"},
                                                 {"AWS_DEFAULT_REGION", "r2"}}));
    REQUIRE(s.has_value());
    CHECK(s->endpoint == "http://127.0.0.1:7480");
    CHECK(s->region == "r1");
    CHECK(s->path_style);
    CHECK_FALSE(s3_settings_from_env("b00", env_of({{"AWS_ENDPOINT_URL", "http://h:1"},
                                                    {"NEFFCACHE_S3_ADDRESSING", "virtual"}}))
                     ->path_style);
  }
  SECTION("a malformed endpoint or addressing is refused") {
    auto bad = s3_settings_from_env("b00", env_of({{"AWS_ENDPOINT_URL", "ftp://h/x"}}));
    REQUIRE_FALSE(bad.has_value());
    CHECK_THAT(bad.error().message, ContainsSubstring("ftp://h/x"));
    CHECK_FALSE(s3_settings_from_env("b00", env_of({{"NEFFCACHE_S3_ADDRESSING", "dns"}})).has_value());
  }
  SECTION("the profile's region from the AWS config file") {
    test::TempDir home;
    test::spit(home / ".aws/config", "[default]\nregion = ap-south-1\n[profile ci]\nregion = us-west-2\n");
    CHECK(s3_settings_from_env("b00", env_of({{"HOME", home.path()}}))->region == "ap-south-1");
    CHECK(s3_settings_from_env("b00", env_of({{"HOME", home.path()}, {"AWS_PROFILE", "ci"}}))->region == "us-west-2");
  }
}

TEST_CASE("S3 credentials from the environment and from profiles", "[s3]") {
  SECTION("the environment, session token included") {
    auto c = credentials_from_env(env_of({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"},
                                          {"AWS_SESSION_TOKEN", "TOK"}}));
    REQUIRE(c.has_value());
    REQUIRE(c->has_value());
    CHECK((*c)->access_key == "AK");
    CHECK((*c)->secret_key == "SK");
    CHECK((*c)->session_token == "TOK");
    CHECK_FALSE(credentials_from_env(env_of({}))->has_value());
    auto half = credentials_from_env(env_of({{"AWS_ACCESS_KEY_ID", "AK"}}));
    REQUIRE_FALSE(half.has_value());
    CHECK_THAT(half.error().message, ContainsSubstring("AWS_SECRET_ACCESS_KEY"));
  }
  SECTION("the shared credentials file, default or AWS_PROFILE") {
    test::TempDir home;
    test::spit(home / ".aws/credentials",
               "# comment\n[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n"
               "[ci]\naws_access_key_id=CIK\naws_secret_access_key=cisecret\naws_session_token = citoken\n"
               "[broken]\naws_access_key_id = X\n");
    auto def = credentials_from_profile(env_of({{"HOME", home.path()}}));
    REQUIRE(def.has_value());
    CHECK((*def)->access_key == "DEF");
    auto ci = credentials_from_profile(env_of({{"HOME", home.path()}, {"AWS_PROFILE", "ci"}}));
    REQUIRE(ci.has_value());
    CHECK((*ci)->secret_key == "cisecret");
    CHECK((*ci)->session_token == "citoken");
    auto missing = credentials_from_profile(env_of({{"HOME", home.path()}, {"AWS_PROFILE", "nope"}}));
    REQUIRE_FALSE(missing.has_value());
    CHECK_THAT(missing.error().message, ContainsSubstring("'nope'"));
    CHECK_FALSE(credentials_from_profile(env_of({{"HOME", home.path()}, {"AWS_PROFILE", "broken"}})).has_value());
    // No file and no named profile: simply none from this source.
    CHECK_FALSE(credentials_from_profile(env_of({{"HOME", "/nonexistent"}}))->has_value());
  }
}

TEST_CASE("S3 objects round-trip through radosgw: put, head, get, list, delete", "[s3]") {
  auto s3 = test::fresh_bucket("roundtrip");
  std::string key = "neuronxcc-2.15/MODULE_1+abc/compile_flags.json";
  auto put = s3->put(key, R"(["--target=trn1"])");
  REQUIRE(put.has_value());
  CHECK_FALSE(put->etag.empty());
  auto head = s3->head(key);
  REQUIRE(head.has_value());
  CHECK(head->size == 17);
  CHECK(head->etag == put->etag);
  CHECK(*s3->get(key) == R"(["--target=trn1"])");
  REQUIRE(s3->put("neuronxcc-2.15/MODULE_2+abc/model.neff", "x").has_value());
  REQUIRE(s3->put("other/file", "y").has_value());

  auto all = s3->list("neuronxcc-2.15/");
  REQUIRE(all.has_value());
  CHECK(all->objects.size() == 2);
  auto folders = s3->list("neuronxcc-2.15/", "/");
  REQUIRE(folders.has_value());
  CHECK(folders->objects.empty());
  CHECK(folders->prefixes ==
        std::vector<std::string>{"neuronxcc-2.15/MODULE_1+abc/", "neuronxcc-2.15/MODULE_2+abc/"});

  REQUIRE(s3->remove(key).has_value());
  auto gone = s3->head(key);
  REQUIRE_FALSE(gone.has_value());
  CHECK(gone.error().code == Errc::not_found);
  CHECK(s3->remove(key).has_value());  // absent already: fine
}

TEST_CASE("S3 listing follows every page", "[s3]") {
  auto s3 = test::fresh_bucket("pages");
  // radosgw and AWS return at most 1000 keys a page.
  for (int i = 0; i < 1105; ++i) REQUIRE(s3->put(fmt::format("p/{:05}", i), "").has_value());
  auto all = s3->list("p/");
  REQUIRE(all.has_value());
  REQUIRE(all->objects.size() == 1105);
  CHECK(all->objects.back().key == "p/01104");
}

TEST_CASE("S3 conditional writes: create only if absent, replace only a known version", "[s3]") {
  auto s3 = test::fresh_bucket("conditional");
  auto first = s3->put("lease", "A", {.if_absent = true});
  REQUIRE(first.has_value());
  auto second = s3->put("lease", "B", {.if_absent = true});
  REQUIRE_FALSE(second.has_value());
  CHECK(second.error().code == Errc::precondition_failed);
  CHECK(*s3->get("lease") == "A");

  auto stale = s3->put("lease", "C", {.if_match = "0123456789abcdef0123456789abcdef"});
  REQUIRE_FALSE(stale.has_value());
  CHECK(stale.error().code == Errc::precondition_failed);
  // The ETag as a listing or an SDK gives it, quoted, works too.
  auto replaced = s3->put("lease", "D", {.if_match = fmt::format("\"{}\"", first->etag)});
  REQUIRE(replaced.has_value());
  CHECK(*s3->get("lease") == "D");
}

TEST_CASE("S3 copies an object on the server, only while it is the version checked", "[s3]") {
  auto s3 = test::fresh_bucket("copy");
  auto first = s3->put("a/MODULE_1+x/model.neff", "NEFF one");
  REQUIRE(first.has_value());
  auto copied = s3->copy("a/MODULE_1+x/model.neff", "a/MODULE_2+y/model.neff", first->etag);
  INFO((copied ? "" : copied.error().message));
  REQUIRE(copied.has_value());
  CHECK(*copied == first->etag);  // one part: the same bytes have the same MD5
  CHECK(*s3->get("a/MODULE_2+y/model.neff") == "NEFF one");

  // Replaced since it was checked: nothing is copied.
  REQUIRE(s3->put("a/MODULE_1+x/model.neff", "NEFF two").has_value());
  auto stale = s3->copy("a/MODULE_1+x/model.neff", "a/MODULE_3+z/model.neff", first->etag);
  REQUIRE_FALSE(stale.has_value());
  CHECK(stale.error().code == Errc::precondition_failed);
  CHECK(s3->head("a/MODULE_3+z/model.neff").error().code == Errc::not_found);
  // No source: not found.
  auto none = s3->copy("a/none/model.neff", "a/MODULE_4+w/model.neff");
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().code == Errc::not_found);
}

TEST_CASE("S3 streams large files up in parts and down to disk", "[s3]") {
  test::TempDir dir;
  std::string bytes = pattern((23u << 20) + 12345);  // 5 parts, the last one short
  test::spit(dir / "big.neff", bytes);
  auto s3 = client_with(test::unique_bucket("multipart"), S3Settings{.multipart_threshold = 8u << 20,
                                                                     .part_size = 5u << 20});
  REQUIRE(s3->create_bucket().has_value());
  auto up = s3->upload("e/model.neff", (dir / "big.neff").string());
  INFO((up ? "" : up.error().message));
  REQUIRE(up.has_value());
  CHECK(s3->head("e/model.neff")->size == bytes.size());
  auto down = s3->download("e/model.neff", (dir / "copy.neff").string());
  REQUIRE(down.has_value());
  CHECK(test::slurp(dir / "copy.neff") == bytes);
  // A small file goes in one PUT, byte for byte.
  test::spit(dir / "small", "tiny");
  REQUIRE(s3->upload("e/small", (dir / "small").string()).has_value());
  CHECK(*s3->get("e/small") == "tiny");
}

TEST_CASE("an LNL NEFF published in parts gets a record naming its ETag, which indexes it", "[s3][index][lnl]") {
  // A NEFF over the multipart threshold is given its ETag when the upload completes; the
  // record must name that one (else the bucket's index would never key the entry).
  test::TempDir dir;
  const std::string key = "0123456789abcdef0123456789abcdef";
  const std::string entry = (dir / key).string(), neff = entry + "/" + lnl_neff_name(key);
  test::spit(neff, pattern(3000));
  test::spit(entry + "/.compilation_complete", lnl_marker(1, 3000));
  struct stat st {};
  REQUIRE(::stat(neff.c_str(), &st) == 0);
  nlohmann::ordered_json ours{{"compiler_version", "2.21.0"}};
  detail::describe_neff(ours, st);
  const OwnFiles own = own_files(entry);
  REQUIRE(own.make().has_value());
  test::spit(own.record, ours.dump());
  auto s3 = client_with(test::unique_bucket("lnlparts"), S3Settings{.multipart_threshold = 1000});
  REQUIRE(s3->create_bucket().has_value());
  auto up = detail::upload_s3_result(*s3, "e/" + key, EntryFiles::of_entry_path(entry), neff);
  INFO((up ? "" : up.error().message));
  REQUIRE(up.has_value());
  const auto record = nlohmann::json::parse(s3->get("e/" + key + "/.neffcache-meta.json").value());
  CHECK(record["compiler_version"] == "2.21.0");
  CHECK(record["size"] == 3000);
  const std::string etag = detail::unquote(s3->head("e/" + key + "/" + lnl_neff_name(key))->etag);
  CHECK(etag.find('-') != std::string::npos);  // a multipart ETag
  CHECK(record["etag"] == etag);
}

TEST_CASE("an S3 download of a missing object leaves no file", "[s3]") {
  auto s3 = test::fresh_bucket("missing");
  test::TempDir dir;
  auto r = s3->download("no/such/model.neff", (dir / "model.neff").string());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::not_found);
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("a wrong S3 secret is refused with a message that says so", "[s3]") {
  auto bucket = test::fresh_bucket("secret")->bucket();
  test::S3Env wrong(std::map<std::string, std::string>{{"AWS_SECRET_ACCESS_KEY", "not-the-secret"}});
  auto url = parse_cache_url(fmt::format("s3://{}", bucket));
  auto s3 = S3Client::open(*url, wrong.lookup());
  REQUIRE(s3.has_value());
  auto r = (*s3)->put("k", "v");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::denied);
  CHECK_THAT(r.error().message, ContainsSubstring("SignatureDoesNotMatch"));
  CHECK_THAT(r.error().message, ContainsSubstring("secret key"));
  CHECK_THAT(r.error().message, ContainsSubstring("environment"));
  CHECK((*s3)->retries() == 0);  // a refusal is not retried
}

TEST_CASE("S3 requests to a server that is not there are retried, then fail", "[s3]") {
  // A port nothing listens on: every try is refused at once.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  S3Settings s{.endpoint = fmt::format("http://127.0.0.1:{}", ntohs(addr.sin_port)), .max_attempts = 4,
               .backoff_base = std::chrono::milliseconds(5)};
  S3Client s3("nobucket", s, S3Credentials{"a", "b", "", {}, "test"});
  auto r = s3.get("k");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::io);
  CHECK_THAT(r.error().message, ContainsSubstring("after 4 tries"));
  CHECK(s3.retries() == 3);
}


TEST_CASE("S3 answers 503 SlowDown are retried with backoff until one passes", "[s3][faults]") {
  auto direct = test::fresh_bucket("slowdown");
  test::FaultyProxy proxy("503", 3);
  auto s3 = proxy.client(direct->bucket());
  auto r = s3->put("k", "value");
  INFO((r ? "" : r.error().message));
  REQUIRE(r.has_value());
  CHECK(s3->retries() == 3);
  CHECK(*direct->get("k") == "value");
}

TEST_CASE("S3 answers 503 that never stop end in a clean error", "[s3][faults]") {
  auto direct = test::fresh_bucket("slowdown2");
  test::FaultyProxy proxy("503", 1000);
  auto s3 = proxy.client(direct->bucket(), 3);
  auto r = s3->put("k", "value");
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, ContainsSubstring("SlowDown"));
  CHECK_THAT(r.error().message, ContainsSubstring("after 3 tries"));
  CHECK(direct->head("k").error().code == Errc::not_found);
}

TEST_CASE("S3 connections cut before the answer are retried", "[s3][faults]") {
  auto direct = test::fresh_bucket("cut");
  REQUIRE(direct->put("k", "value").has_value());
  test::FaultyProxy proxy("cut", 2);
  auto s3 = proxy.client(direct->bucket());
  auto r = s3->get("k");
  REQUIRE(r.has_value());
  CHECK(*r == "value");
  CHECK(s3->retries() == 2);
}

TEST_CASE("an S3 upload cut halfway is retried and the object arrives whole", "[s3][faults]") {
  auto direct = test::fresh_bucket("cutupload");
  test::TempDir dir;
  std::string bytes = pattern(3u << 20);
  test::spit(dir / "model.neff", bytes);
  test::FaultyProxy proxy("cut-upload", 2);
  auto s3 = proxy.client(direct->bucket());
  auto r = s3->upload("e/model.neff", (dir / "model.neff").string());
  INFO((r ? "" : r.error().message));
  REQUIRE(r.has_value());
  CHECK(s3->retries() == 2);
  CHECK(*direct->get("e/model.neff") == bytes);
}

TEST_CASE("an S3 download cut halfway is retried and the file is whole", "[s3][faults]") {
  auto direct = test::fresh_bucket("cutdownload");
  test::TempDir dir;
  std::string bytes = pattern(3u << 20);
  test::spit(dir / "up", bytes);
  REQUIRE(direct->upload("e/model.neff", (dir / "up").string()).has_value());
  test::FaultyProxy proxy("cut-download", 2);
  auto s3 = proxy.client(direct->bucket());
  auto r = s3->download("e/model.neff", (dir / "model.neff").string());
  INFO((r ? "" : r.error().message));
  REQUIRE(r.has_value());
  CHECK(s3->retries() == 2);
  CHECK(test::slurp(dir / "model.neff") == bytes);
}

TEST_CASE("an S3 server that stops mid-upload leaves no object, only a clean error", "[s3][faults]") {
  auto direct = test::fresh_bucket("stopped");
  test::TempDir dir;
  test::spit(dir / "model.neff", pattern(12u << 20));  // three parts of 5 MiB
  SECTION("a single PUT") {
    test::FaultyProxy proxy("stop", 0);
    auto s3 = proxy.client(direct->bucket(), 3);
    test::spit(dir / "small.neff", pattern(1u << 20));
    auto r = s3->upload("e/model.neff", (dir / "small.neff").string());
    REQUIRE_FALSE(r.has_value());
    CHECK_THAT(r.error().message, ContainsSubstring("after 3 tries"));
  }
  SECTION("a multipart upload, gone after its first part") {
    test::FaultyProxy proxy("stop", 2);  // the start and part 1 pass
    auto s3 = proxy.client(direct->bucket(), 3);
    auto r = s3->upload("e/model.neff", (dir / "model.neff").string());
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::io);
  }
  auto head = direct->head("e/model.neff");
  REQUIRE_FALSE(head.has_value());
  CHECK(head.error().code == Errc::not_found);
}

TEST_CASE("S3 credentials come from the instance metadata service (IMDSv2)", "[s3]") {
  const auto& server = test::s3_server();
  test::Child imds({"python3", std::string(test::path::s3_scripts) + "/imds_stub.py", server.access_key, server.secret_key});
  std::string port = imds.line();
  REQUIRE(!port.empty());
  auto bucket = test::fresh_bucket("imds")->bucket();
  test::S3Env env(std::map<std::string, std::string>{{"AWS_ACCESS_KEY_ID", ""},
                                                     {"AWS_SECRET_ACCESS_KEY", ""},
                                                     {"AWS_EC2_METADATA_DISABLED", ""},
                                                     {"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:" + port}});
  auto s3 = S3Client::open(*parse_cache_url("s3://" + bucket), env.lookup());
  INFO((s3 ? "" : s3.error().message));
  REQUIRE(s3.has_value());
  REQUIRE((*s3)->put("k", "from a role").has_value());
  CHECK(*(*s3)->get("k") == "from a role");

  // Without any source: one clear error naming where it looked.
  test::S3Env none(std::map<std::string, std::string>{{"AWS_ACCESS_KEY_ID", ""},
                                                      {"AWS_SECRET_ACCESS_KEY", ""},
                                                      {"AWS_EC2_METADATA_DISABLED", ""},
                                                      {"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1"}});
  auto refused = S3Client::open(*parse_cache_url("s3://" + bucket), none.lookup());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == Errc::denied);
  CHECK_THAT(refused.error().message, ContainsSubstring("instance metadata"));
}
