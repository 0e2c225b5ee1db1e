// What other tools put in or expect of the Neuron cache (../shared/notes/neuron-cache-facts.md,
// "Other things real tools put in or expect of this cache"), checked through the mount
// against the backing folder: optimum-neuron's registry with symbolic links, MODULE_
// folders without flags, files at the root, and its status tool's view of each entry.
#include <unistd.h>

#include <set>

#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

namespace {

// optimum-neuron's classification of an entry folder, from the facts: success (model.neff
// and model.done), failed (model.log without model.neff), locked (any *.lock), else empty.
std::string optimum_status(const fs::path& entry) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(entry)) names.insert(e.path().filename().string());
  if (names.contains("model.neff") && names.contains("model.done")) return "success";
  if (names.contains("model.log") && !names.contains("model.neff")) return "failed";
  for (const auto& n : names)
    if (n.ends_with(".lock")) return "locked";
  return "empty";
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

}  // namespace

TEST_CASE("optimum-neuron's cache through the mount: its registry and symlinks, folders that are no entries, "
          "and each entry's status as on the disk", "[fuse][neuron-facts]") {
  auto check = [](bool retry_failed) {
    Mount m({}, retry_failed ? std::vector<std::string>{"--retry-failed"} : std::vector<std::string>{});
    const fs::path b = m.backing(), v = b / "neuronxcc-2.21.0";
    auto done = m.entry("gopjrt_tuple.hlo.pb", "done+1"), failed = m.entry("spu_jax_cnn.hlo.pb", "failed+2"),
         pending = m.entry("spu_tf_jit_comp.hlo.pb", "pending+3"), locked = m.entry("gopjrt_jax_xp1.hlo.pb", "lock+4");
    test::spit(b / done / "model.neff", "a NEFF");
    test::spit(b / done / "model.done", "");
    test::spit(b / failed / "model.log", "ERROR\n");
    test::spit(b / locked / "model.hlo_module.pb.lock", "");  // left by a killed compile
    // A traced model copied in (copytree), in a MODULE_ folder without "+<flags>".
    fs::create_directories(v / "MODULE_0123abcd");
    test::spit(v / "MODULE_0123abcd" / "model.pt", "torch");
    test::spit(v / "MODULE_0123abcd" / "config.json", "{}");
    // The registry, with an alias folder as a symbolic link; files at the root.
    fs::create_directories(v / "0_REGISTRY" / "0.3.0" / "llama");
    test::spit(v / "0_REGISTRY" / "0.3.0" / "llama" / "1a2b.json", R"({"model": "llama"})");
    fs::create_directory_symlink("llama", v / "0_REGISTRY" / "0.3.0" / "alias");
    test::spit(b / "model.pt", "compiled artifacts");
    test::spit(b / "neuron_config.json", "{}");

    const fs::path mv = m.mnt() / "neuronxcc-2.21.0";
    // Every entry's status as on the disk: placeholders are never listed (a pending entry
    // reads as empty, as its folder does), with or without --retry-failed.
    for (const auto& e : {done, locked, pending, failed}) {
      INFO(e);
      CHECK(optimum_status(m.mnt() / e) == optimum_status(b / e));
    }
    CHECK(optimum_status(b / failed) == "failed");
    CHECK(optimum_status(b / locked) == "locked");
    CHECK(optimum_status(b / pending) == "empty");
    // Folders that are no entries pass through as they are, links included.
    CHECK(names_in(mv / "MODULE_0123abcd") == names_in(v / "MODULE_0123abcd"));
    CHECK(fs::is_symlink(mv / "0_REGISTRY" / "0.3.0" / "alias"));
    CHECK(fs::read_symlink(mv / "0_REGISTRY" / "0.3.0" / "alias") == "llama");
    CHECK(test::slurp(mv / "0_REGISTRY" / "0.3.0" / "alias" / "1a2b.json") == R"({"model": "llama"})");
    CHECK(test::slurp(m.mnt() / "model.pt") == "compiled artifacts");
    // optimum makes its links through the mount too (os.symlink).
    REQUIRE(::symlink("llama", (mv / "0_REGISTRY" / "0.3.0" / "alias2").c_str()) == 0);
    CHECK(fs::read_symlink(v / "0_REGISTRY" / "0.3.0" / "alias2") == "llama");
    CHECK(m.compiles() == 0);
    return optimum_status(m.mnt() / failed);
  };
  CHECK(check(false) == "failed");
  CHECK(check(true) == "failed");
}

TEST_CASE("an entry of another compiler's folder passes through as on a disk: no placeholder, no compile, its "
          "client compiles it", "[fuse][neuron-facts]") {
  Mount m;
  auto ours = m.entry("gopjrt_tuple.hlo.pb", "ours+1");
  // The folder libneuronxla of another SDK names (the full version its compiler reports).
  const std::string theirs = "neuronxcc-2.21.0.0+b0d7f0f4/MODULE_theirs+2";
  fs::create_directories(m.backing() / theirs);
  fs::copy_file(test::k_corpus / "spu_jax_cnn.hlo.pb", m.backing() / theirs / "model.hlo_module.pb");
  CHECK(names_in(m.mnt() / ours) == std::set<std::string>{"model.hlo_module.pb"});
  CHECK(::access((m.mnt() / ours / "model.neff").c_str(), F_OK) == 0);  // a placeholder, found by name
  CHECK(names_in(m.mnt() / theirs) == std::set<std::string>{"model.hlo_module.pb"});
  CHECK(::access((m.mnt() / theirs / "model.neff").c_str(), F_OK) != 0);
  CHECK(errno == ENOENT);
  // An HLO written through the mount into such a folder starts no compile either.
  const std::string fresh = "neuronxcc-2.20.0/MODULE_fresh+3";
  fs::create_directories(m.mnt() / fresh);
  write_plain(m.mnt() / fresh / "model.hlo_module.pb", test::slurp(test::k_corpus / "gopjrt_x_squared.hlo.pb"));
  // Its client compiles it, as on a disk: the NEFF and model.done it writes are its own.
  test::spit(m.mnt() / theirs / "model.neff", "client's NEFF");
  test::spit(m.mnt() / theirs / "model.done", "");
  CHECK(test::slurp(m.backing() / theirs / "model.neff") == "client's NEFF");
  // Ours compiles on open; theirs never did.
  auto [err, bytes] = read_all(m.mnt() / ours / "model.neff");
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(bytes).has_value());
  std::this_thread::sleep_for(300ms);
  CHECK(m.compiles() == 1);
  CHECK(names_in(m.backing() / fresh) == std::set<std::string>{"model.hlo_module.pb"});
}
