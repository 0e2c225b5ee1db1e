// Compiling entries with the real process runner and fake-neuronx-cc.
#include <fcntl.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/compile/compile.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/hlo/hlo.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "cgroup.hpp"
#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;

namespace {

using test::k_fake;

// An entry holding a corpus HLO (and compile_flags.json when flags are given).
std::string make_entry(const test::fs::path& root, const std::string& corpus_file,
                       std::optional<std::vector<std::string>> flags = std::nullopt,
                       std::string_view hlo_name = k_hlo_module_file) {
  auto dir = root / "neuronxcc-2.21.0" / ("MODULE_" + corpus_file);
  test::fs::create_directories(dir);
  test::fs::copy_file(test::k_corpus / corpus_file, dir / std::string(hlo_name));
  if (flags) REQUIRE(write_compile_flags((dir / "compile_flags.json").string(), *flags).has_value());
  return dir.string();
}

CompileSettings fake_settings(const test::TempDir& work) {
  CompileSettings s;
  s.compiler = CompilerTemplate::parse(k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags} --verbose=35").value();
  s.workdir_root = work.path().string();
  s.kill_grace = 500ms;
  return s;
}

struct TupleCompile {
  std::string entry;
  CompileResult r;
};

// An entry of gopjrt_tuple.hlo.pb under `root`, compiled with fake_settings(work) by the
// fake compiler at full speed with `name`=`value` in its environment.
TupleCompile compile_tuple_with(const test::TempDir& root, const test::TempDir& work, const char* name,
                                const std::string& value) {
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv env(name, value);
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto r = compile_entry(entry, fake_settings(work));
  return {entry, r};
}

EntryState state_of(const std::string& entry) {
  EntryState st{};
  auto root = test::fs::path(entry).parent_path().parent_path();
  REQUIRE(for_each_entry(root.string(), [&](const EntryRef& e) {
            if (root / e.relative_path() == test::fs::path(entry)) st = entry_state(e);
          }).has_value());
  return st;
}

// Names in the entry that are neither Neuron files nor our documented extras.
std::vector<std::string> stray_files(const std::string& entry) {
  std::vector<std::string> out;
  for (const auto& e : test::fs::directory_iterator(entry)) {
    auto n = e.path().filename().string();
    if (n != "model.hlo_module.pb" && n != "model.hlo.pb" && n != "compile_flags.json" && n != "model.neff" &&
        n != "model.done" && n != "model.log" && n != k_compile_log_file && n != k_meta_file)
      out.push_back(n);
  }
  return out;
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

TEST_CASE("compiler templates are checked and expanded", "[compile]") {
  auto t = CompilerTemplate::parse("cc --in={hlo} -o {neff} {flags} --wd '{workdir}' --tag {key}.x");
  REQUIRE(t.has_value());
  auto argv = t->expand({"/w/in.pb", "/w/out.neff", "/w", "MODULE_k", {"-O1", "--a b"}});
  CHECK(argv == std::vector<std::string>{"cc", "--in=/w/in.pb", "-o", "/w/out.neff", "-O1", "--a b", "--wd", "/w",
                                         "--tag", "MODULE_k.x"});
  auto d = CompilerTemplate::default_template().expand({"h", "n", "w", "k", {}});
  CHECK(d == std::vector<std::string>{"neuronx-cc", "compile", "--framework=XLA", "--target=trn1", "h", "--output",
                                      "n", "--verbose=35"});
  for (std::string_view bad : {"", "cc {hlo}", "cc {neff}", "cc {hlo} {neff} {nope}", "cc {hlo} {neff} -F{flags}",
                               "cc {hlo} {neff} {", "cc {hlo} {neff} }", "cc '{hlo} {neff}"}) {
    INFO(bad);
    auto r = CompilerTemplate::parse(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().message.rfind("bad compiler template", 0) == 0);
  }
}

TEST_CASE("a compile publishes a whole NEFF, done marker and metadata", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto entry = make_entry(root.path(), "rocm08_normal_9.hlo_proto.pb", std::vector<std::string>{"-O2", "--cache_dir=/x"});
  auto r = compile_entry(entry, fake_settings(work));
  INFO(r.message);
  REQUIRE(r.outcome == CompileOutcome::success);
  CHECK(r.attempts == 1);
  auto neff = fake::parse_fake_neff(test::slurp(test::fs::path(entry) / "model.neff"));
  REQUIRE(neff.has_value());
  CHECK(neff->graph == analyze_hlo(test::slurp(test::k_corpus / "rocm08_normal_9.hlo_proto.pb"))->canonical_sha256);
  CHECK(neff->flags == R"(["--target=trn1", "-O2"])");  // from compile_flags.json, wrapper option removed
  CHECK(test::fs::exists(test::fs::path(entry) / "model.done"));
  auto meta = nlohmann::json::parse(test::slurp(test::fs::path(entry) / std::string(k_meta_file)));
  CHECK(meta["size"] == test::fs::file_size(test::fs::path(entry) / "model.neff"));
  CHECK(meta["xxh3"].get<std::string>().size() == 16);
  CHECK(state_of(entry) == EntryState::done);
  CHECK(stray_files(entry).empty());  // no lock, no temp file
  CHECK(test::fs::is_empty(work.path()));  // work directory removed
  CHECK((test::fs::status(test::fs::path(entry) / "model.neff").permissions() & test::fs::perms::others_write) ==
        test::fs::perms::none);

  SECTION("a done entry is not compiled again") {
    test::ScopedEnv log("NEFFCACHE_FAKE_LOG", (work / "compiles.log").string());
    CHECK(compile_entry(entry, fake_settings(work)).outcome == CompileOutcome::already_done);
    CHECK(test::count_lines(work / "compiles.log") == 0);
  }
}

TEST_CASE("a compile removes the half-written copies a dead publisher left", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto entry = make_entry(root.path(), "rocm08_normal_9.hlo_proto.pb", std::vector<std::string>{"-O2"});
  const test::fs::path dir(entry);
  test::spit(dir / ".neffcache-neff-0123456789abcdef", "half a NEFF");
  test::spit(dir / ".neffcache-log-0123456789abcdef", "half a log");
  test::spit(dir / ".neffcache-lock-someone", "a lock being created by another process");
  auto r = compile_entry(entry, fake_settings(work));
  INFO(r.message);
  REQUIRE(r.outcome == CompileOutcome::success);
  CHECK_FALSE(test::fs::exists(dir / ".neffcache-neff-0123456789abcdef"));
  CHECK_FALSE(test::fs::exists(dir / ".neffcache-log-0123456789abcdef"));
  CHECK(test::fs::exists(dir / ".neffcache-lock-someone"));
}

TEST_CASE("without compile_flags.json the caller's flags are used; legacy HLO names work", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb", std::nullopt, k_hlo_legacy_file);
  auto s = fake_settings(work);
  s.default_flags = {"-O1", "--retry_failed_compilation"};
  REQUIRE(compile_entry(entry, s).outcome == CompileOutcome::success);
  CHECK(fake::parse_fake_neff(test::slurp(test::fs::path(entry) / "model.neff"))->flags == R"(["--target=trn1", "-O1"])");
}

TEST_CASE("a compile_flags.json that is no list of flags is the entry's failure, recorded", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  for (std::string bad : {R"({"flags": "-O1"})", R"(["-O1", "--cache_dir"])"}) {
    INFO(bad);
    auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
    test::spit(test::fs::path(entry) / "compile_flags.json", bad);
    auto r = compile_entry(entry, fake_settings(work));
    CHECK(r.outcome == CompileOutcome::failed);
    CHECK(r.attempts == 0);
    CHECK(test::slurp(test::fs::path(entry) / "model.log").find("compile_flags.json") != std::string::npos);
    test::fs::remove_all(entry);
  }
}

TEST_CASE("a compiler error records model.log and no NEFF, as the Neuron cache does", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv log("NEFFCACHE_FAKE_LOG", (work / "compiles.log").string());
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  {
    test::ScopedEnv fail("NEFFCACHE_FAKE_FAIL", "3");
    auto r = compile_entry(entry, fake_settings(work));
    CHECK(r.outcome == CompileOutcome::failed);
    CHECK(r.message == "compiler exited with status 3");
  }
  auto model_log = test::slurp(test::fs::path(entry) / "model.log");
  CHECK(model_log.find("injected compile failure") != std::string::npos);
  CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.neff"));
  CHECK(state_of(entry) == EntryState::failed);
  CHECK(stray_files(entry).empty());

  // Cached: not compiled again until retried.
  CHECK(compile_entry(entry, fake_settings(work)).outcome == CompileOutcome::failed_cached);
  CHECK(test::count_lines(work / "compiles.log") == 1);
  auto s = fake_settings(work);
  s.retry_failed = true;
  CHECK(compile_entry(entry, s).outcome == CompileOutcome::success);
  CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.log"));
  CHECK(test::count_lines(work / "compiles.log") == 2);
}

TEST_CASE("a corrupt HLO fails its compile with the reason in model.log", "[compile]") {
  test::TempDir root, work;
  auto entry = root / test::k_fake_dir / "MODULE_bad+0";
  test::fs::create_directories(entry);
  test::spit(entry / "model.hlo_module.pb", "definitely not protobuf");
  auto r = compile_entry(entry.string(), fake_settings(work));
  CHECK(r.outcome == CompileOutcome::failed);
  CHECK(test::slurp(entry / "model.log").find("not a readable HLO module") != std::string::npos);
}

TEST_CASE("an HLO that is a FIFO, a link or a folder is refused unread: recorded, and nothing blocks", "[compile]") {
  test::TempDir root, work, outside;
  test::spit(outside / "secret", "not for the cache");
  const std::vector<std::string> kinds{"fifo", "link to a device", "link outside", "folder"};
  for (const auto& kind : kinds) {
    INFO(kind);
    auto entry = root / test::k_fake_dir / ("MODULE_" + std::to_string(&kind - kinds.data()) + "+0");
    test::fs::create_directories(entry);
    const auto hlo = entry / "model.hlo_module.pb";
    // A FIFO with no writer blocks a plain open for ever; /dev/zero never ends; a link
    // may lead to what its creator may not read, and root may.
    if (kind == "fifo") REQUIRE(::mkfifo(hlo.c_str(), 0644) == 0);
    if (kind == "link to a device") test::fs::create_symlink("/dev/zero", hlo);
    if (kind == "link outside") test::fs::create_symlink(outside / "secret", hlo);
    if (kind == "folder") test::fs::create_directory(hlo);
    auto analyzed = analyze_hlo_file(hlo.string());  // what a scheduler reads for the job's key
    REQUIRE_FALSE(analyzed.has_value());
    CHECK(analyzed.error().message.find("not a regular file") != std::string::npos);
    auto r = compile_entry(entry.string(), fake_settings(work));
    CHECK(r.outcome == CompileOutcome::failed);
    CHECK(test::slurp(entry / "model.log").find("not a regular file") != std::string::npos);
    CHECK_FALSE(test::fs::exists(entry / "model.neff"));
  }
}

TEST_CASE("a compile log planted as a link is not written through", "[compile]") {
  test::TempDir root, work, outside;
  test::spit(outside / "victim", "keep me");
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  // Root would truncate whatever the link names.
  test::fs::create_symlink(outside / "victim", test::fs::path(entry) / std::string(k_compile_log_file));
  auto r = compile_entry(entry, fake_settings(work));
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(test::slurp(outside / "victim") == "keep me");
  CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.neff"));
}

TEST_CASE("users are found by name or number; unknown ones are errors", "[compile]") {
  auto by_name = find_user("nobody");
  REQUIRE(by_name.has_value());
  auto by_number = find_user(std::to_string(by_name->uid));
  REQUIRE(by_number.has_value());
  CHECK(by_number->name == "nobody");
  CHECK(by_number->gid == by_name->gid);
  for (const char* unknown : {"no-such-user-here", "99999999999999999999", ""}) {
    INFO(unknown);
    auto u = find_user(unknown);
    REQUIRE_FALSE(u.has_value());
    CHECK(u.error().message.find("unknown user") != std::string::npos);
  }
}

TEST_CASE("a work folder is removed without following the links in it", "[compile]") {
  test::TempDir dir, outside;
  test::spit(outside / "keep", "not ours");
  const auto work = dir / "work";
  test::fs::create_directories(work / "a" / "b");
  test::spit(work / "a" / "b" / "file", "x");
  test::fs::create_directory_symlink(outside.path(), work / "a" / "link");  // to a folder
  test::fs::create_symlink(outside / "keep", work / "file-link");           // to a file
  REQUIRE(::mkfifo((work / "fifo").c_str(), 0600) == 0);
  detail::remove_tree_at(AT_FDCWD, work.string());
  CHECK_FALSE(test::fs::exists(work));
  CHECK(test::slurp(outside / "keep") == "not ours");
}

TEST_CASE("a compile as another user: its own work folder; what it writes to the entry is the HLO owner's",
          "[compile]") {
  if (::geteuid() != 0) SKIP("needs root, as the CI machines give");
  // The compiler runs as nobody, so everything it reaches must be open to others.
  test::TempDir root, work, bin;
  for (const auto* d : {&work, &bin}) test::fs::permissions(d->path(), test::fs::perms(0755));
  test::fs::copy_file(k_fake, bin / "fake-neuronx-cc");
  const auto log = work / "compiles.log";
  test::spit(log, "");
  test::fs::permissions(log, test::fs::perms(0666));
  test::ScopedEnv log_env("NEFFCACHE_FAKE_LOG", log.string());
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto s = fake_settings(work);
  s.compiler = CompilerTemplate::parse((bin / "fake-neuronx-cc").string() + " compile {hlo} --output {neff} {flags}").value();
  auto nobody = find_user("nobody");
  REQUIRE(nobody.has_value());
  const uid_t owner_uid = 4242;  // the HLO's owner: neither root nor the compiler's user
  const gid_t owner_gid = 4343;
  auto owned_entry = [&](const std::string& corpus_file) {
    auto e = make_entry(root.path(), corpus_file);
    REQUIRE(::chown((e + "/model.hlo_module.pb").c_str(), owner_uid, owner_gid) == 0);
    return e;
  };
  const mode_t mask = ::umask(022);
  auto check_owned = [&](const std::string& entry, const std::vector<std::string>& names) {
    for (const auto& n : names) {
      INFO(n);
      struct stat st {};
      REQUIRE(::lstat((entry + "/" + n).c_str(), &st) == 0);
      CHECK(st.st_uid == owner_uid);
      CHECK(st.st_gid == owner_gid);
      CHECK((st.st_mode & 0777) == 0644);  // the umask, and never writable by others
    }
  };

  s.run_as = *nobody;
  auto entry = owned_entry("gopjrt_tuple.hlo.pb");
  REQUIRE(compile_entry(entry, s).outcome == CompileOutcome::success);
  CHECK(test::logged_uid(log, 0) == static_cast<long>(nobody->uid));
  check_owned(entry, {"model.neff", "model.done", std::string(k_meta_file), std::string(k_compile_log_file)});
  {
    test::ScopedEnv fail("NEFFCACHE_FAKE_FAIL", "1");
    auto failing = owned_entry("gopjrt_x_squared.hlo.pb");
    REQUIRE(compile_entry(failing, s).outcome == CompileOutcome::failed);
    check_owned(failing, {"model.log"});
  }
  // Run as root, the compiler is root; what it publishes is still the HLO owner's.
  s.run_as.reset();
  auto as_root = owned_entry("spu_tf_jit_comp.hlo.pb");
  REQUIRE(compile_entry(as_root, s).outcome == CompileOutcome::success);
  CHECK(test::logged_uid(log, 2) == 0);
  check_owned(as_root, {"model.neff", "model.done"});
  ::umask(mask);
  // Every work folder is gone, whoever owned it.
  std::vector<std::string> left;
  for (const auto& f : test::fs::directory_iterator(work.path())) left.push_back(f.path().filename().string());
  CHECK(left == std::vector<std::string>{"compiles.log"});
}

TEST_CASE("a compiler killed by a signal is transient: nothing recorded, nothing partial", "[compile]") {
  test::TempDir root, work;
  // The fake leaves a partial output first. (Not SEGV: a sanitized fake catches that.)
  auto [entry, r] = compile_tuple_with(root, work, "NEFFCACHE_FAKE_SIGNAL", "TERM");
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(r.message == "compiler killed by signal 15");
  CHECK_FALSE(r.oom_killed);
  CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.log"));
  CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.neff"));
  CHECK(state_of(entry) == EntryState::pending);
  CHECK(test::slurp(test::fs::path(entry) / std::string(k_compile_log_file)).find("transient") != std::string::npos);
}

TEST_CASE("a compiler that fails for want of disk space is transient and compiles once space is back", "[compile]") {
  test::TempDir root, work;
  test::Tmpfs small("1m");  // the compiler's work folder, too small for its 4 MiB NEFF
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv bytes("NEFFCACHE_FAKE_NEFF_BYTES", "4194304");
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto s = fake_settings(work);
  s.workdir_root = small.path().string();
  auto r = compile_entry(entry, s);
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(r.message == "compiler exited with status 1 and printed 'No space left on device'");
  CHECK(state_of(entry) == EntryState::pending);  // no model.log: nothing is poisoned
  CHECK(stray_files(entry).empty());
  s.workdir_root = work.path().string();
  CHECK(compile_entry(entry, s).outcome == CompileOutcome::success);
}

TEST_CASE("what a compiler prints tells a full disk or host memory from a bad graph", "[compile]") {
  CHECK(detail::resource_exhaustion("OSError: [Errno 28] No space left on device: '/tmp/x'") == "No space left on device");
  CHECK(detail::resource_exhaustion("numpy.core._exceptions.MemoryError: Unable to allocate") == "MemoryError");
  CHECK(detail::resource_exhaustion("terminate called after throwing an instance of 'std::bad_alloc'") ==
        "std::bad_alloc");
  CHECK_FALSE(detail::resource_exhaustion("ERROR: Unsupported operator: custom-call"));
  CHECK_FALSE(detail::resource_exhaustion("Estimated peak HBM usage exceeds the device memory"));
}

TEST_CASE("an out-of-memory kill, in each of its three forms, is transient and handed back at once", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv log("NEFFCACHE_FAKE_LOG", (work / "compiles.log").string());
  test::ScopedEnv mem("NEFFCACHE_FAKE_MEMORY_MB", "24");  // the peak it is killed at
  std::optional<test::ScopedEnv> a, b;
  std::string form;
  SECTION("SIGKILL, the kernel's OOM killer") {
    a.emplace("NEFFCACHE_FAKE_SIGNAL", "KILL");
    form = "(signal 9)";
  }
  SECTION("exit 137, a launcher reporting its compiler SIGKILLed") {
    a.emplace("NEFFCACHE_FAKE_FAIL", "137");
    form = "(exit 137)";
  }
  SECTION("exit 70 with neuronx-cc's own report, [F137]") {
    a.emplace("NEFFCACHE_FAKE_FAIL", "70");
    b.emplace("NEFFCACHE_FAKE_FAIL_MESSAGE",
              "[F137] neuronx-cc was forcibly killed - This most commonly occurs due to insufficient system memory.");
    form = "(exit 70, [F137])";
  }
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto s = fake_settings(work);
  s.max_retries = 3;  // not for these: the same memory would be killed again
  auto r = compile_entry(entry, s);
  INFO(r.message);
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(r.oom_killed);
  CHECK(r.attempts == 1);
  CHECK(test::count_lines(work / "compiles.log") == 1);
  CHECK(r.peak_rss_kib >= 24 * 1024);
  CHECK(r.message == fmt::format("compiler killed for lack of memory {} at a peak of {} MiB", form,
                                 (r.peak_rss_kib + 512) / 1024));
  // Nothing recorded: no model.log, no NEFF; the entry stays pending, the log says why.
  CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.log"));
  CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.neff"));
  CHECK(state_of(entry) == EntryState::pending);
  CHECK(stray_files(entry).empty());
  CHECK(test::slurp(test::fs::path(entry) / std::string(k_compile_log_file))
            .find(r.message + " (transient: nothing recorded)") != std::string::npos);
  for (const auto& f : test::fs::directory_iterator(work.path()))  // the work folder is gone
    CHECK(f.path().filename() == "compiles.log");
}

TEST_CASE("a real kernel OOM kill in a small memory cgroup, of the compiler or of its child, is oom_killed",
          "[compile]") {
  std::string why;
  auto cgroup = test::MemoryCgroup::create(48 << 20, why);
  if (!cgroup) SKIP("no memory cgroup for this test: " + why);
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv mem("NEFFCACHE_FAKE_MEMORY_MB", "256");  // far beyond the 48 MiB limit
  std::optional<test::ScopedEnv> child;
  std::string form;
  SECTION("the compiler itself: SIGKILL") { form = "(signal 9)"; }
  SECTION("its child, as the OOM killer picks the largest process: neuronx-cc's [F137] and exit 70") {
    child.emplace("NEFFCACHE_FAKE_MEMORY_CHILD", "1");
    form = "(exit 70, [F137])";
  }
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto s = fake_settings(work);
  // Only the compiler moves into the cgroup: the shell moves itself, then becomes it.
  s.compiler = CompilerTemplate::parse(fmt::format(
                   "sh -c 'echo $$ > {} && exec {} compile --framework=XLA --target=trn1 {{hlo}} --output {{neff}}'",
                   cgroup->dir() + "/cgroup.procs", k_fake))
                   .value();
  s.compiler_version = std::string(test::k_fake_version);  // (sh reports none)
  auto r = compile_entry(entry, s);
  INFO(r.message);
  INFO(test::slurp(test::fs::path(entry) / std::string(k_compile_log_file)));
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(r.oom_killed);
  CHECK(r.message.find(form) != std::string::npos);
  // What it reached before the limit. (No upper bound: a sanitized fake's resident set
  // counts its shadow memory, far beyond the cgroup's 48 MiB.)
  CHECK(r.peak_rss_kib >= 16 * 1024);
  CHECK_FALSE(test::fs::exists(test::fs::path(entry) / "model.log"));
  CHECK(state_of(entry) == EntryState::pending);
}

TEST_CASE("an exit 70 without neuronx-cc's [F137] is a recorded failure like any other", "[compile]") {
  test::TempDir root, work;
  auto [entry, r] = compile_tuple_with(root, work, "NEFFCACHE_FAKE_FAIL", "70");
  CHECK(r.outcome == CompileOutcome::failed);
  CHECK_FALSE(r.oom_killed);
  CHECK(r.message == "compiler exited with status 70");
  CHECK(state_of(entry) == EntryState::failed);
}

TEST_CASE("transient failures are retried up to max_retries; an OOM kill is not", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv once("NEFFCACHE_FAKE_SIGNAL_ONCE", (work / "died-once").string());
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto s = fake_settings(work);
  s.max_retries = 1;
  SECTION("another signal (SIGTERM) is retried") {
    test::ScopedEnv sig("NEFFCACHE_FAKE_ONCE_SIGNAL", "TERM");
    auto r = compile_entry(entry, s);
    CHECK(r.outcome == CompileOutcome::success);
    CHECK(r.attempts == 2);
  }
  SECTION("a SIGKILL is handed back, and the next compile succeeds") {
    auto r = compile_entry(entry, s);
    CHECK(r.outcome == CompileOutcome::transient);
    CHECK(r.oom_killed);
    CHECK(r.attempts == 1);
    auto again = compile_entry(entry, s);
    CHECK(again.outcome == CompileOutcome::success);
    CHECK_FALSE(again.oom_killed);
  }
}

TEST_CASE("a hung compiler is timed out and its whole process group is gone", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv hang("NEFFCACHE_FAKE_HANG", "1");  // hangs, with a child that hangs too
  test::ScopedEnv log("NEFFCACHE_FAKE_LOG", (work / "compiles.log").string());
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto s = fake_settings(work);
  s.timeout = 500ms;
  auto start = std::chrono::steady_clock::now();
  auto r = compile_entry(entry, s);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(r.message.find("timed out") != std::string::npos);
  pid_t compiler = std::stoi(test::slurp(work / "compiles.log"));
  // The group was sent SIGKILL; its last members may take a moment to finish dying on
  // a loaded machine.
  bool gone = false;
  for (int i = 0; i < 200 && !(gone = test::no_process_in_group(compiler)); ++i) std::this_thread::sleep_for(10ms);
  CHECK(gone);
  CHECK(state_of(entry) == EntryState::pending);
}

TEST_CASE("a compiler holds the lock it inherits until it exits, even when its parent lets go", "[compile]") {
  test::TempDir dir;
  const auto file = dir / "model.hlo_module.pb.lock";
  test::touch(file);
  auto locked_by_someone = [&] {
    detail::UniqueFd probe(::open(file.c_str(), O_RDWR | O_CLOEXEC));
    return detail::kernel_lock_held_elsewhere(probe.get());
  };
  int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(detail::set_ofd_lock(fd, F_WRLCK));
  bool held_after_close = false;
  RunSpec spec;
  spec.argv = {"sleep", "0.5"};
  spec.inherit_fd = fd;
  spec.tick_interval = 50ms;
  int ticks = 0;
  spec.tick = [&] {
    if (++ticks == 1) ::close(fd);  // our description is gone; the child's remains
    else held_after_close = held_after_close || locked_by_someone();
    return true;
  };
  PosixRunner runner;
  auto r = runner.run(spec);
  REQUIRE(r.has_value());
  CHECK(r->end == RunEnd::exited);
  CHECK(held_after_close);
  CHECK_FALSE(locked_by_someone());  // and gone with the child
}

TEST_CASE("a compiler gets stdio and the lock it inherits, as descriptor 3: no other descriptor of ours",
          "[compile]") {
  test::TempDir dir;
  // As a library opens them: a descriptor without close-on-exec (libcurl's sockets).
  int leaky[2];
  REQUIRE(::pipe(leaky) == 0);
  detail::UniqueFd leaky_read(leaky[0]), leaky_write(leaky[1]);
  detail::UniqueFd lock(::open((dir / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  REQUIRE(lock);
  detail::UniqueFd log(::open((dir / "log").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  REQUIRE(log);
  RunSpec spec;
  // The shell's own descriptors (listed by a child of it: no pipe of the shell's), and
  // what its descriptor 3 is.
  spec.argv = {"sh", "-c", "ls /proc/$$/fd; if [ -e /proc/$$/fd/3 ]; then readlink /proc/$$/fd/3; fi"};
  spec.log_fd = log.get();
  PosixRunner runner;
  auto run = [&] {
    REQUIRE(::ftruncate(log.get(), 0) == 0);
    REQUIRE(::lseek(log.get(), 0, SEEK_SET) == 0);
    auto r = runner.run(spec);
    REQUIRE(r.has_value());
    CHECK(r->exit_code == 0);
    return test::slurp(dir / "log");
  };
  CHECK(run() == "0\n1\n2\n");
  spec.inherit_fd = lock.get();
  CHECK(run() == fmt::format("0\n1\n2\n3\n{}\n", test::fs::canonical(dir / "lock").string()));
}

TEST_CASE("an entry locked by someone else is busy and nothing runs", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv log("NEFFCACHE_FAKE_LOG", (work / "compiles.log").string());
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto held = EntryLock::try_acquire(entry + "/model.hlo_module.pb.lock");
  REQUIRE(held.has_value());
  auto r = compile_entry(entry, fake_settings(work));
  CHECK(r.outcome == CompileOutcome::busy);
  CHECK(r.message.find("held by a running process") != std::string::npos);
  CHECK(test::count_lines(work / "compiles.log") == 0);
}

TEST_CASE("an entry of another compiler's folder is never compiled: refused in one line naming both versions",
          "[compile]") {
  test::TempDir root, work;
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");  // neuronxcc-2.21.0
  // libneuronxla names the folder after the full version: 2.21.0.0+b0d7f0f4 is another
  // compiler. (A program file of its own: versions are asked once per file.)
  const auto other = work / "other-neuronx-cc";
  test::spit(other, "#!/bin/sh\nNEFFCACHE_FAKE_VERSION=2.21.0.0+b0d7f0f4 exec " + k_fake + " \"$@\"\n");
  test::fs::permissions(other, test::fs::perms::owner_all);
  auto s = fake_settings(work);
  s.compiler = CompilerTemplate::parse(other.string() + " compile {hlo} --output {neff}").value();
  auto r = compile_entry(entry, s);
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(r.refused);
  CHECK(r.attempts == 0);
  CHECK(r.message.find("its folder is for compiler 2.21.0, and '" + other.string() + "' reports 2.21.0.0+b0d7f0f4") !=
        std::string::npos);
  CHECK(r.message.find('\n') == std::string::npos);
  // Nothing written: no lock, no log, no record.
  CHECK(stray_files(entry).empty());
  CHECK(!test::fs::exists(test::fs::path(entry) / std::string(k_compile_log_file)));
  CHECK(state_of(entry) == EntryState::pending);
  // A compiler that names no version compiles no Neuron entry either.
  s.compiler = CompilerTemplate::parse("env " + k_fake + " compile {hlo} --output {neff}").value();
  r = compile_entry(entry, s);
  CHECK(r.refused);
  CHECK(r.message.find("'env' reports no version") != std::string::npos);
  // The compiler of the folder's version compiles it.
  CHECK(compile_entry(entry, fake_settings(work)).outcome == CompileOutcome::success);
}

TEST_CASE("the folder a Neuron entry is in is its compiler's whatever its name; an LNL key is every compiler's",
          "[compile]") {
  const std::string v21 = compiler_dir_name("2.21.0");
  CHECK(compiler_dir_serves("/c/neuronxcc-2.21.0/MODULE_1+2", v21));
  CHECK(compiler_dir_serves("/c/neuronxcc-2.21.0/MODULE_1+2/", v21));
  CHECK_FALSE(compiler_dir_serves("/c/neuronxcc-2.21.0/MODULE_1+2", compiler_dir_name("2.21.0.0+b0d7f0f4")));
  CHECK_FALSE(compiler_dir_serves("/c/neuronxcc-2.21.0/MODULE_1+2", ""));  // a compiler with no version
  // A folder of another name is no compiler's.
  CHECK_FALSE(compiler_dir_serves("/c/models/MODULE_1+2", v21));
  CHECK_FALSE(compiler_dir_serves("/c/models/MODULE_1+2", ""));
  // Only an entry with no folder before it is every compiler's, as an LNL entry is.
  CHECK(compiler_dir_serves("MODULE_1+2", v21));
  CHECK(compiler_dir_serves("MODULE_1+2", ""));
  CHECK(compiler_dir_serves("/c/0123456789abcdef0123456789abcdef", v21));
  CHECK(compiler_dir_serves("/c/0123456789abcdef0123456789abcdef", ""));
}

TEST_CASE("a missing compiler is a clear transient error", "[compile]") {
  test::TempDir root, work;
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto s = fake_settings(work);
  s.compiler = CompilerTemplate::parse("no-such-neuronx-cc {hlo} {neff}").value();
  auto r = compile_entry(entry, s);
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK(r.message.find("no-such-neuronx-cc") != std::string::npos);
  CHECK(state_of(entry) == EntryState::pending);
}

TEST_CASE("peak memory and compile time are recorded", "[compile]") {
  test::TempDir root, work;
  auto [entry, r] = compile_tuple_with(root, work, "NEFFCACHE_FAKE_MEMORY_MB", "96");
  REQUIRE(r.outcome == CompileOutcome::success);
  CHECK(r.peak_rss_kib >= 96 * 1024);
  auto meta = nlohmann::json::parse(test::slurp(test::fs::path(entry) / std::string(k_meta_file)));
  CHECK(meta["peak_rss_kib"].get<long>() >= 96 * 1024);
  // No scheduler admitted it by memory: no reservation, no earlier OOM kill.
  CHECK(meta["predicted_peak_kib"] == 0);
  CHECK(meta["oom_retries"] == 0);
}

TEST_CASE("the metadata keeps the reservation a compile was admitted with and its earlier OOM kills", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto s = fake_settings(work);
  s.predicted_peak_kib = 3'000'000'000;  // beyond 32 bits: a KiB count of a 2.8 TiB host
  s.oom_retries = 2;
  REQUIRE(compile_entry(entry, s).outcome == CompileOutcome::success);
  auto meta = nlohmann::json::parse(test::slurp(test::fs::path(entry) / std::string(k_meta_file)));
  CHECK(meta["predicted_peak_kib"].get<uint64_t>() == 3'000'000'000);
  CHECK(meta["oom_retries"].get<int>() == 2);
  CHECK(meta["peak_rss_kib"].get<long>() > 0);
}

TEST_CASE("the peak of a compiler that holds its memory in a child is measured on the whole tree", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv mem("NEFFCACHE_FAKE_MEMORY_MB", "64");
  test::ScopedEnv child("NEFFCACHE_FAKE_MEMORY_CHILD", "1");
  test::ScopedEnv secs("NEFFCACHE_FAKE_SECONDS", "0.5");  // a few samples' worth
  test::ScopedEnv idle("NEFFCACHE_FAKE_IDLE", "1");
  auto entry = make_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto r = compile_entry(entry, fake_settings(work));
  REQUIRE(r.outcome == CompileOutcome::success);
  CHECK(r.peak_rss_kib >= 60 * 1024);
  auto meta = nlohmann::json::parse(test::slurp(test::fs::path(entry) / std::string(k_meta_file)));
  CHECK(meta["peak_rss_kib"].get<long>() >= 60 * 1024);
  CHECK(test::slurp(test::fs::path(entry) / std::string(k_compile_log_file)).find("touched 64 MiB in a child process") !=
        std::string::npos);
}

TEST_CASE("the runner sums the memory of every process in the group at once, which ru_maxrss cannot", "[compile]") {
  // Two compilers side by side under one shell, 40 MiB each: the shell's ru_maxrss is the
  // larger of its reaped children (about 40 MiB); only the samples see the 80 MiB held
  // together.
  test::TempDir work;
  const std::string in = (test::k_corpus / "gopjrt_tuple.hlo.pb").string();
  auto one = [&](const std::string& out) {
    return fmt::format("{} compile --framework=XLA --target=trn1 {} --output {}", k_fake, in, (work / out).string());
  };
  RunSpec spec;
  spec.argv = {"env", "NEFFCACHE_FAKE_MEMORY_MB=40", "NEFFCACHE_FAKE_SECONDS=0.6", "NEFFCACHE_FAKE_IDLE=1", "sh", "-c",
               one("a.neff") + " >/dev/null & " + one("b.neff") + " >/dev/null & wait"};
  PosixRunner runner;
  auto r = runner.run(spec);
  REQUIRE(r.has_value());
  CHECK(r->end == RunEnd::exited);
  CHECK(r->exit_code == 0);
  CHECK(r->sampled_peak_kib >= 76 * 1024);
  CHECK(r->peak_rss_kib >= r->sampled_peak_kib);
  CHECK(fake::parse_fake_neff(test::slurp(work / "a.neff")).has_value());
  CHECK(fake::parse_fake_neff(test::slurp(work / "b.neff")).has_value());
}

TEST_CASE("a process group's memory is read from /proc/<pid>/stat after the last ')'", "[compile]") {
  // comm may hold spaces and parentheses; field 5 is the group, field 24 the resident pages.
  const std::string stat =
      "4242 (a) b (c)) S 1 4240 4240 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000000 321 18446744073709551615";
  CHECK(detail::stat_rss_kib_in_group(stat, 4240, 4) == 321 * 4);
  CHECK(detail::stat_rss_kib_in_group(stat, 4241, 4) == 0);  // another group
  CHECK(detail::stat_rss_kib_in_group("4242 (a", 4240, 4) == 0);
  CHECK(detail::stat_rss_kib_in_group("4242 (a) S 1 4240 4240", 4240, 4) == 0);  // cut short
  // This process: its group holds at least what it holds itself.
  CHECK(detail::group_rss_kib(::getpgrp()) > 0);
  CHECK(detail::group_rss_kib(999'999'999) == 0);  // no such group
}

TEST_CASE("a reader polling model.neff during publishes never sees a partial file", "[compile]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv size("NEFFCACHE_FAKE_NEFF_BYTES", std::to_string(8 << 20));
  auto entry = make_entry(root.path(), "rocm_normal_9.hlo_proto.pb");
  const auto neff = test::fs::path(entry) / "model.neff";
  std::atomic<bool> stop{false};
  std::atomic<int> seen{0}, partial{0};
  std::thread reader([&] {
    while (!stop) {
      auto bytes = detail::read_file(neff.string());
      if (!bytes) continue;
      ++seen;
      if (!fake::parse_fake_neff(*bytes)) ++partial;
    }
  });
  auto s = fake_settings(work);
  s.retry_failed = true;
  for (int i = 0; i < 6; ++i) {
    REQUIRE(compile_entry(entry, s).outcome == CompileOutcome::success);
    // Back to pending for the next round, as `neffcache retry` would.
    test::fs::remove(test::fs::path(entry) / "model.done");
    test::fs::remove(neff);
  }
  stop = true;
  reader.join();
  CHECK(partial == 0);
  CHECK(seen > 0);
}

TEST_CASE("NEURON_PARALLEL_COMPILE_MAX_RETRIES sets the retries, and bad values are errors", "[compile]") {
  auto with = [](std::optional<std::string> v) {
    return max_retries_from_env([v](const char*) { return v; });
  };
  CHECK(*with(std::nullopt) == 0);
  CHECK(*with("") == 0);
  CHECK(*with("3") == 3);
  for (std::string bad : {"-1", "two", "3.5", "1000", " 2"}) {
    auto r = with(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().message.find("NEURON_PARALLEL_COMPILE_MAX_RETRIES") == 0);
  }
}

// Faults injected through the library's system-call seam (detail/sys.hpp): every call of a
// whole compile failed in turn.

TEST_CASE("an EINTR at every system call of a compile is retried and changes nothing", "[compile][faults]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto entry = make_entry(root.path(), "rocm08_normal_9.hlo_proto.pb", std::vector<std::string>{"-O2"});
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
    auto entry = make_entry(root.path(), "rocm08_normal_9.hlo_proto.pb", std::vector<std::string>{"-O2"});
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
    auto entry = make_entry(root.path(), "rocm08_normal_9.hlo_proto.pb", std::vector<std::string>{"-O2"});
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

TEST_CASE("a copy into place is whole or nothing: a checksum that differs leaves the target as it was",
          "[compile]") {
  test::TempDir dir;
  test::spit(dir / "neff", "neff bytes");
  test::spit(dir / "out", "old");
  detail::UniqueFd in(::open((dir / "neff").c_str(), O_RDONLY | O_CLOEXEC));
  const std::string sum = detail::xxh3_hex(detail::xxh3_64("neff bytes"));
  auto wrong = detail::copy_into_place(in.get(), (dir / "neff").string(), (dir / "out").string(), "0000000000000000");
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().message.find("changed while it was copied") != std::string::npos);
  CHECK(test::slurp(dir / "out") == "old");
  REQUIRE(detail::copy_into_place(in.get(), (dir / "neff").string(), (dir / "out").string(), sum).has_value());
  CHECK(test::slurp(dir / "out") == "neff bytes");
  REQUIRE(detail::copy_into_place(in.get(), (dir / "neff").string(), (dir / "plain").string()).has_value());
  CHECK(test::slurp(dir / "plain") == "neff bytes");
  // Nothing else is left in the folder: no temporary file of the failed copy.
  CHECK(std::distance(test::fs::directory_iterator(dir.path()), test::fs::directory_iterator()) == 3);
}
