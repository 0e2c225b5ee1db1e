#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/lnl.hpp>

#include "support.hpp"

using namespace neffcache;

TEST_CASE("flags hash matches Python's json.dumps and md5 on every committed vector", "[flags]") {
  auto vectors = nlohmann::json::parse(test::slurp(test::k_data / "flags_vectors.json"));
  REQUIRE(vectors.size() >= 15);
  for (const auto& v : vectors) {
    std::vector<std::string> flags;
    for (const auto& h : v["flags_hex"]) flags.push_back(test::hex_decode(h.get<std::string>()));
    INFO("json: " << v["json"].get<std::string>());
    CHECK(python_json_list(flags) == v["json"].get<std::string>());
    CHECK(flags_hash(flags, FlagsHashForm::json) == v["json_hash"].get<std::string>());
    CHECK(flags_hash(flags, FlagsHashForm::legacy) == v["legacy_hash"].get<std::string>());
  }
}

TEST_CASE("flags hash examples from the Neuron cache notes", "[flags]") {
  CHECK(flags_hash({}, FlagsHashForm::legacy) == "d41d8cd9");
  CHECK(flags_hash({"--target=trn1"}) == "e30acd3a");
  CHECK(flags_hash({"--model-type=transformer"}, FlagsHashForm::legacy) == "abb26765");
  // The JSON form of no flags is md5("[]"), not md5(""): both forms exist in the wild.
  CHECK(flags_hash({}) == "d7517139");
}

TEST_CASE("shell_split matches Python's shlex.split on every committed vector", "[flags]") {
  auto vectors = nlohmann::json::parse(test::slurp(test::k_data / "shlex_vectors.json"));
  for (const auto& v : vectors) {
    std::string input = test::hex_decode(v["input_hex"].get<std::string>());
    INFO("input: " << input);
    auto r = shell_split(input);
    if (v.contains("error")) {
      REQUIRE_FALSE(r.has_value());
      CHECK(r.error().code == Errc::invalid_argument);
      CHECK(r.error().message.find("flags") != std::string::npos);
    } else {
      REQUIRE(r.has_value());
      std::vector<std::string> expected;
      for (const auto& h : v["words_hex"]) expected.push_back(test::hex_decode(h.get<std::string>()));
      CHECK(*r == expected);
    }
  }
}

TEST_CASE("wrapper options are separated from compiler flags", "[flags]") {
  auto r = parse_neuron_cc_flags(
      "--target=trn1 --cache_dir=/a --retry_failed_compilation -O1 --log_level INFO "
      "--no_cache --compile_workdir /w --dump=/d --model-type=transformer");
  REQUIRE(r.has_value());
  CHECK(r->compiler_flags == std::vector<std::string>{"--target=trn1", "-O1", "--model-type=transformer"});
  CHECK(r->wrapper.cache_dir == "/a");
  CHECK(r->wrapper.retry_failed_compilation);
  CHECK(r->wrapper.no_cache);
  CHECK(r->wrapper.log_level == "INFO");
  CHECK(r->wrapper.compile_workdir == "/w");
  CHECK(r->wrapper.dump == "/d");

  SECTION("the separate-value form and the = form are the same option") {
    auto a = parse_neuron_cc_flags("--cache_dir '/with space'");
    REQUIRE(a.has_value());
    CHECK(a->wrapper.cache_dir == "/with space");
    CHECK(a->compiler_flags.empty());
  }
  SECTION("bare --dump is recorded, and look-alike flags are not taken for options") {
    auto a = parse_neuron_cc_flags("--dump --cache_dirx=1 --no_cache_please");
    REQUIRE(a.has_value());
    CHECK(a->wrapper.dump == "");
    CHECK(a->compiler_flags == std::vector<std::string>{"--cache_dirx=1", "--no_cache_please"});
    CHECK_FALSE(a->wrapper.no_cache);
  }
  SECTION("an option that needs a value and has none is an error") {
    auto a = parse_neuron_cc_flags("-O1 --cache_dir");
    REQUIRE_FALSE(a.has_value());
    CHECK(a.error().message == "--cache_dir needs a value");
  }
  SECTION("wrapper options never change the hash") {
    auto a = parse_neuron_cc_flags("--target=trn1 --cache_dir=/x --retry_failed_compilation");
    REQUIRE(a.has_value());
    CHECK(flags_hash(a->compiler_flags) == "e30acd3a");
  }
}

TEST_CASE("an entry's compiler flags: its compile_flags.json, else the defaults, wrapper options removed", "[flags]") {
  test::TempDir dir;
  const std::string entry = (dir / "MODULE_1+aa").string();
  const std::vector<std::string> defaults{"--target=trn1", "--retry_failed_compilation", "-O2"};
  EntryFiles none, with_json;
  with_json.note(k_compile_flags_file);

  auto from_defaults = entry_compiler_flags(entry, none, defaults);
  REQUIRE(from_defaults.has_value());
  CHECK(*from_defaults == std::vector<std::string>{"--target=trn1", "-O2"});

  const std::string path = entry + "/compile_flags.json";
  test::spit(path, R"(["-O1", "--cache_dir", "/tmp/c", "--model-type=transformer"])");
  auto from_file = entry_compiler_flags(entry, with_json, defaults);
  REQUIRE(from_file.has_value());
  CHECK(*from_file == std::vector<std::string>{"-O1", "--model-type=transformer"});
  CHECK(*neuron_compiler_flags(std::optional(path), defaults) == *from_file);
  CHECK(*neuron_compiler_flags(std::nullopt, defaults) == *from_defaults);

  SECTION("an entry's own fault: bad contents, or a wrapper option without its value") {
    test::spit(path, R"(["-O1", 3])");
    auto bad = entry_compiler_flags(entry, with_json, defaults);
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.error().code == Errc::bad_flags_file);
    test::spit(path, R"(["-O1", "--cache_dir"])");
    auto valueless = entry_compiler_flags(entry, with_json, defaults);
    REQUIRE_FALSE(valueless.has_value());
    CHECK(valueless.error().code == Errc::invalid_argument);
    CHECK(valueless.error().message == path + ": --cache_dir needs a value");
  }
  SECTION("a read that fails is Errc::io: not the entry's fault") {
    sys::ScopedFaultHook eio([](sys::Call c, std::string_view) { return c == sys::Call::read ? EIO : 0; });
    auto failed = entry_compiler_flags(entry, with_json, defaults);
    REQUIRE_FALSE(failed.has_value());
    CHECK(failed.error().code == Errc::io);
  }
}

TEST_CASE("compile_flags.json round-trips and its md5 is the flags hash", "[flags]") {
  test::TempDir dir;
  std::vector<std::string> flags{"--target=trn1", "-O1", "é \"q\""};
  std::string path = (dir / "compile_flags.json").string();
  REQUIRE(write_compile_flags(path, flags).has_value());
  std::string text = test::slurp(path);
  CHECK(text == python_json_list(flags));
  CHECK(detail::md5_hex(text).substr(0, 8) == flags_hash(flags));
  auto back = read_compile_flags(path);
  REQUIRE(back.has_value());
  CHECK(*back == flags);

  SECTION("malformed files give a clear error naming the file") {
    for (std::string bad : {"", "{\"a\": 1}", "[\"ok\", 3]", "[\"unterminated"}) {
      test::spit(path, bad);
      auto r = read_compile_flags(path);
      REQUIRE_FALSE(r.has_value());
      CHECK(r.error().code == Errc::bad_flags_file);
      CHECK(r.error().message.find(path) != std::string::npos);
    }
  }
  SECTION("a missing file is not_found") {
    auto r = read_compile_flags((dir / "absent.json").string());
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::not_found);
  }
}
