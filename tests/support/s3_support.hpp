// The S3 server the S3 tests run against: radosgw started by ctest's `radosgw` fixture
// (tests/s3/radosgw.sh), whose address and credentials are in test::path::s3_dir/s3.env.
// A test that needs it fails when it is not running; it never skips.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <fmt/format.h>

#include <neffcache/s3/client.hpp>
#include <neffcache/s3/cache.hpp>

#include "paths.hpp"
#include "process.hpp"
#include "support.hpp"

namespace test {

struct S3Server {
  std::string endpoint, access_key, secret_key;
};

inline const S3Server& s3_server() {
  static const S3Server server = [] {
    S3Server s;
    auto text = neffcache::detail::read_file(std::string(test::path::s3_dir) + "/s3.env");
    INFO("the S3 server is started by ctest's radosgw fixture (tests/s3/radosgw.sh start "
         << test::path::s3_dir << ")");
    REQUIRE(text.has_value());
    auto section = neffcache::detail::ini_section("[s3]\n" + *text, "s3");
    for (const auto& [k, v] : *section) {
      if (k == "S3_ENDPOINT") s.endpoint = v;
      else if (k == "S3_ACCESS_KEY") s.access_key = v;
      else if (k == "S3_SECRET_KEY") s.secret_key = v;
    }
    REQUIRE(!s.endpoint.empty());
    return s;
  }();
  return server;
}

// An environment for the S3 code: the test server's endpoint and credentials, with
// anything in `extra` added or overriding (an empty value unsets). Nothing of the
// process's own environment leaks in.
class S3Env {
 public:
  explicit S3Env(std::map<std::string, std::string> extra = {}) {
    const auto& s = s3_server();
    vars_ = {{"AWS_ENDPOINT_URL", s.endpoint},
             {"AWS_ACCESS_KEY_ID", s.access_key},
             {"AWS_SECRET_ACCESS_KEY", s.secret_key},
             {"AWS_REGION", "us-east-1"},
             {"AWS_EC2_METADATA_DISABLED", "true"},
             {"HOME", "/nonexistent"}};
    for (auto& [k, v] : extra) vars_[k] = v;
  }
  // Empty values count as unset.
  neffcache::EnvLookup lookup() const {
    auto set = vars_;
    std::erase_if(set, [](const auto& kv) { return kv.second.empty(); });
    return env_of(std::move(set));
  }
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

// Words for env(1) that give a command the test server's endpoint and credentials, no
// Neuron cache variables, and `env` (NAME=value words).
inline std::vector<std::string> s3_env_words(const std::vector<std::string>& env = {}) {
  std::vector<std::string> words{"-u", "NEURON_CC_FLAGS", "-u", "NEURON_COMPILE_CACHE_URL"};
  S3Env s3env;
  for (const auto& [k, v] : s3env.vars()) words.push_back(k + "=" + v);
  words.insert(words.end(), env.begin(), env.end());
  return words;
}

// A command line that runs `tool` (the neffcache tool by default) with s3_env_words(env).
inline std::vector<std::string> s3_tool_argv(const std::vector<std::string>& args,
                                             const std::vector<std::string>& env = {},
                                             const std::string& tool = k_tool) {
  std::vector<std::string> argv{"env"};
  auto words = s3_env_words(env);
  argv.insert(argv.end(), words.begin(), words.end());
  argv.push_back(tool);
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The path in the cache of a test's i-th entry; `first` keeps the tests of one file apart.
inline std::string fake_entry(int i, int first) {
  return fmt::format("neuronxcc-2.21.0/MODULE_{}+4f2d9c1a", first + i);
}

// Stores `n` pending entries (distinct corpus graphs, with flags) under `prefix`.
inline void put_pending_entries(neffcache::S3Client& s3, const std::string& prefix, int n, int first) {
  auto corpus = corpus_files();
  for (int i = 0; i < n; ++i) {
    const std::string base = neffcache::s3_key(prefix, fake_entry(i, first));
    REQUIRE(s3.put(base + "/compile_flags.json", R"(["--target=trn1"])").has_value());
    REQUIRE(s3.put(base + "/model.hlo_module.pb", slurp(corpus[static_cast<std::size_t>(i)])).has_value());
  }
}

// How many times the fake compiler compiled each entry (MODULE_...), from its log of
// "pid uid input" lines.
inline std::map<std::string, int> compiles_per_entry(const fs::path& log) {
  std::map<std::string, int> out;
  if (!fs::exists(log)) return out;
  std::istringstream in(slurp(log));
  for (std::string pid, uid, input; in >> pid >> uid >> input;) {
    auto at = input.find("MODULE_");
    ++out[input.substr(at, input.find('/', at) - at)];
  }
  return out;
}

// Checks that the fake compiler compiled each of `n` entries exactly once, and never two
// compiles of one entry at a time (NEFFCACHE_FAKE_EXCLUSIVE_DIR=`exclusive`).
inline void check_compiled_once(const fs::path& log, const fs::path& exclusive, int n) {
  auto per_entry = compiles_per_entry(log);
  CHECK(per_entry.size() == static_cast<std::size_t>(n));
  for (const auto& [entry, count] : per_entry) {
    INFO(entry);
    CHECK(count == 1);
  }
  CHECK_FALSE(fs::exists(exclusive / "clashes"));
}

// Environment for the fake compiler of several daemons over one bucket: every compile
// lasts long enough (0.4 s, idle) for another host to start the same entry, and two
// compiles of one entry at once leave a clash in `exclusive` (made here) for
// check_compiled_once.
inline std::vector<std::string> exclusive_compile_env(const fs::path& exclusive) {
  fs::create_directories(exclusive);
  return {"NEFFCACHE_FAKE_SECONDS=0.4", "NEFFCACHE_FAKE_IDLE=1", "NEFFCACHE_FAKE_EXCLUSIVE_DIR=" + exclusive.string()};
}

// A bucket name no other test (nor an earlier run) uses.
inline std::string unique_bucket(std::string_view what) {
  static std::atomic<int> n{0};
  return fmt::format("{}-{}-{}", what, ::getpid(), n++);
}

// A new, empty bucket on the test server and a client for it.
inline std::unique_ptr<neffcache::S3Client> fresh_bucket(std::string_view what, const S3Env& env = S3Env{}) {
  auto url = neffcache::parse_cache_url(fmt::format("s3://{}", unique_bucket(what)));
  REQUIRE(url.has_value());
  auto client = neffcache::S3Client::open(*url, env.lookup());
  REQUIRE(client.has_value());
  auto made = (*client)->create_bucket();
  INFO((made ? "" : made.error().message));
  REQUIRE(made.has_value());
  return std::move(*client);
}

// The fault-injecting proxy (tests/s3/faulty_proxy.py) in front of the test server.
struct FaultyProxy {
  // `gate`: the FILE of mode silent-while.
  FaultyProxy(const std::string& mode, int count, const std::string& gate = {})
      : child(argv(mode, count, gate)) {
    port = child.line();
    REQUIRE(!port.empty());
  }
  static std::vector<std::string> argv(const std::string& mode, int count, const std::string& gate) {
    std::vector<std::string> words{"python3", std::string(path::s3_scripts) + "/faulty_proxy.py", upstream_port(), mode,
                                   std::to_string(count)};
    if (!gate.empty()) words.push_back(gate);
    return words;
  }
  // The proxy's endpoint, for a process's environment (AWS_ENDPOINT_URL).
  std::string endpoint() const { return "http://127.0.0.1:" + port; }
  static std::string upstream_port() {
    const auto& e = s3_server().endpoint;
    return e.substr(e.rfind(':') + 1);
  }
  // A client of `bucket` that goes through the proxy, with quick retries.
  std::unique_ptr<neffcache::S3Client> client(const std::string& bucket, int attempts = 6) {
    const auto& s = s3_server();
    neffcache::S3Settings settings{.endpoint = "http://127.0.0.1:" + port, .max_attempts = attempts,
                        .backoff_base = std::chrono::milliseconds(5), .multipart_threshold = 8u << 20,
                        .part_size = 5u << 20};
    return std::make_unique<neffcache::S3Client>(bucket, settings, neffcache::S3Credentials{s.access_key, s.secret_key, "", {}, "test"});
  }
  Child child;
  std::string port;
};

}  // namespace test

// What the S3 tests use, brought in with `using namespace s3test` (as fusetest does for the
// mount tests).
namespace s3test {
using namespace neffcache;
using namespace std::chrono_literals;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;
using test::k_fake_template;
}  // namespace s3test
