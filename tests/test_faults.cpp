// Faults injected through the library's system-call seam (detail/sys.hpp) into whole
// compiles: the real process runner and fake-neuronx-cc, every call failed in turn.
#include <atomic>
#include <mutex>

#include <catch2/catch_test_macros.hpp>
#include <fmt/format.h>

#include <neffcache/compile.hpp>
#include <neffcache/detail/sys.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "support.hpp"

using namespace neffcache;

namespace {

const std::string k_fake = NEFFCACHE_FAKE_COMPILER;

std::string make_entry(const test::fs::path& root) {
  auto dir = root / "neuronxcc-2.21.0" / "MODULE_faults+1";
  test::fs::create_directories(dir);
  test::fs::copy_file(test::k_corpus / "rocm08_normal_9.hlo_proto.pb", dir / "model.hlo_module.pb");
  REQUIRE(write_compile_flags((dir / "compile_flags.json").string(), {"-O2"}).has_value());
  return dir.string();
}

CompileSettings fake_settings(const test::TempDir& work) {
  CompileSettings s;
  s.compiler = CompilerTemplate::parse(k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}").value();
  s.workdir_root = work.path().string();
  return s;
}

const char* call_name(sys::Call c) {
  switch (c) {
    case sys::Call::open: return "open";
    case sys::Call::read: return "read";
    case sys::Call::write: return "write";
    case sys::Call::pwrite: return "pwrite";
    case sys::Call::fsync: return "fsync";
    case sys::Call::rename: return "rename";
    case sys::Call::link: return "link";
    case sys::Call::unlink: return "unlink";
    case sys::Call::mkdir: return "mkdir";
    case sys::Call::mkdtemp: return "mkdtemp";
    case sys::Call::ftruncate: return "ftruncate";
  }
  return "?";
}

// What a compile left in its entry, judged by the promises of compile_entry: a
// model.neff only whole and with its model.done, no half-written copy, no live lock.
void check_entry_consistent(const std::string& entry) {
  const test::fs::path dir(entry);
  if (test::fs::exists(dir / "model.neff")) {
    CHECK(test::fs::exists(dir / "model.done"));
    CHECK(fake::parse_fake_neff(test::slurp(dir / "model.neff")).has_value());
  } else {
    CHECK_FALSE(test::fs::exists(dir / "model.done"));
  }
  for (const auto& f : test::fs::directory_iterator(dir)) {
    auto n = f.path().filename().string();
    CHECK_FALSE(n.starts_with(".neffcache-neff-"));
    CHECK_FALSE(n.starts_with(".neffcache-log-"));
  }
  auto lock = inspect_lock((dir / "model.hlo_module.pb.lock").string());
  REQUIRE(lock.has_value());
  CHECK(lock->state != LockState::live);
}

}  // namespace

TEST_CASE("an EINTR at every system call of a compile is retried and changes nothing", "[compile][faults]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto entry = make_entry(root.path());
  int interrupted = 0;
  CompileResult r;
  {
    // Every other call fails: each call is interrupted once, then made by the retry.
    bool fail_next = true;  // one thread makes the calls
    sys::ScopedFaultHook hook([&](sys::Call, std::string_view) {
      bool fail = std::exchange(fail_next, !fail_next);
      if (!fail) return 0;
      ++interrupted;
      return EINTR;
    });
    r = compile_entry(entry, fake_settings(work));
  }
  INFO(r.message);
  CHECK(r.outcome == CompileOutcome::success);
  CHECK(interrupted > 20);
  check_entry_consistent(entry);
  CHECK(test::fs::exists(test::fs::path(entry) / "model.done"));
  CHECK(test::fs::is_empty(work.path()));
}

TEST_CASE("an EIO or ENOSPC at any system call of a compile: nothing partial, and the next compile publishes",
          "[compile][faults]") {
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  // The calls of a compile without faults, in order.
  std::vector<std::pair<sys::Call, std::string>> calls;
  {
    test::TempDir root, work;
    auto entry = make_entry(root.path());
    std::mutex mu;
    sys::ScopedFaultHook hook([&](sys::Call c, std::string_view path) {
      std::lock_guard lk(mu);
      calls.emplace_back(c, std::string(path));
      return 0;
    });
    REQUIRE(compile_entry(entry, fake_settings(work)).outcome == CompileOutcome::success);
  }
  REQUIRE(calls.size() > 20);

  int failed_compiles = 0;
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const int err = k % 2 == 0 ? EIO : ENOSPC;
    INFO(fmt::format("call {} of {}: {} {} fails with {}", k, calls.size(), call_name(calls[k].first),
                     calls[k].second, std::strerror(err)));
    test::TempDir root, work;
    auto entry = make_entry(root.path());
    CompileResult r;
    {
      std::atomic<std::size_t> seen{0};
      sys::ScopedFaultHook hook([&](sys::Call, std::string_view) { return seen++ == k ? err : 0; });
      r = compile_entry(entry, fake_settings(work));
    }
    INFO(r.message);
    // The machine failed, not the graph: never recorded as the entry's failure. Some
    // calls may fail harmlessly (a log line, the folder's fsync after model.done).
    CHECK((r.outcome == CompileOutcome::transient || r.outcome == CompileOutcome::success));
    if (r.outcome == CompileOutcome::transient) ++failed_compiles;
    check_entry_consistent(entry);
    CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.log"));
    CHECK(test::fs::is_empty(work.path()));

    auto again = compile_entry(entry, fake_settings(work));
    INFO(again.message);
    CHECK((again.outcome == CompileOutcome::success || again.outcome == CompileOutcome::already_done));
    check_entry_consistent(entry);
    CHECK(test::fs::exists(test::fs::path(entry) / "model.done"));
  }
  // Most calls matter: a fault in them stops the compile.
  CHECK(failed_compiles > static_cast<int>(calls.size()) / 2);
}
