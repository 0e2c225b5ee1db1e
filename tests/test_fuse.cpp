// neffcachefs on real mounts: pass-through fidelity, compile on open, single flight,
// failures, eager compiles, start-up checks.
#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <random>
#include <sstream>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <neffcache/compile.hpp>
#include <neffcache/flags.hpp>
#include <neffcache/hlo.hpp>
#include <neffcache/lock.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "hlo_subset.pb.h"
#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string k_daemon = NEFFCACHE_DAEMON;
const std::string k_fake = NEFFCACHE_FAKE_COMPILER;

using test::mounted;
using test::read_all;

// A daemon mounted for the scope of a test; always unmounted (lazily) at the end.
class Mount {
 public:
  // `launcher` comes before everything (prlimit and the like).
  explicit Mount(std::vector<std::string> env = {}, std::vector<std::string> extra = {},
                 std::optional<fs::path> shared_backing = std::nullopt, std::vector<std::string> launcher = {},
                 const std::string& compiler = k_fake)
      : backing_(shared_backing.value_or(dir_ / "backing")) {
    fs::create_directories(mnt());
    std::vector<std::string> argv = launcher;
    argv.insert(argv.end(), {"env", "TMPDIR=" + (dir_ / "work").string(),
                             "NEFFCACHE_FAKE_LOG=" + compile_log().string(), "NEFFCACHE_FAKE_RATE=0"});
    fs::create_directories(dir_ / "work");
    fs::create_directories(backing());
    argv.insert(argv.end(), env.begin(), env.end());
    for (std::string a : {k_daemon, std::string("--foreground"), std::string("--compiler"),
                          compiler + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}",
                          std::string("-j"), std::string("2")})
      argv.push_back(a);
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(backing().string());
    argv.push_back(mnt().string());
    daemon_ = std::make_unique<test::Child>(argv);
    test::await_mount(mnt());
  }
  ~Mount() { test::unmount_and_stop(mnt(), daemon_); }
  fs::path backing() const { return backing_; }
  test::Child& daemon() { return *daemon_; }
  // Stops the daemon with `sig` and waits for it; the mount may stay behind (kill -9).
  int stop(int sig) {
    daemon_->kill(sig);
    int rc = daemon_->wait();
    daemon_.reset();
    return rc;
  }
  fs::path mnt() const { return dir_ / "mnt"; }
  fs::path compile_log() const { return dir_ / "compiles.log"; }
  int compiles() const { return test::count_lines(compile_log()); }
  // Creates a pending entry in the backing directory; returns its path below the root.
  std::string entry(const std::string& corpus_file, const std::string& name) {
    std::string rel = "neuronxcc-2.21.0/MODULE_" + name;
    fs::create_directories(backing() / rel);
    fs::copy_file(test::k_corpus / corpus_file, backing() / rel / "model.hlo_module.pb");
    return rel;
  }

 private:
  test::TempDir dir_;
  fs::path backing_;
  std::unique_ptr<test::Child> daemon_;
};

// Opens `path` in a separate process; its exit status says how the open ended
// (0: read a whole fake NEFF, 5: EIO, 4: EINTR, 3: other error, 2: partial NEFF).
std::unique_ptr<test::Child> reader_process(const fs::path& path) {
  return std::make_unique<test::Child>(std::vector<std::string>{NEFFCACHE_READER, path.string()});
}

// Writes a file in place, without fsync: kernel knobs under /proc, large test trees.
void write_plain(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  REQUIRE(out.good());
}

std::string canonical_of(const std::string& corpus_file) {
  return analyze_hlo(test::slurp(test::k_corpus / corpus_file))->canonical_sha256;
}

}  // namespace

TEST_CASE("opening model.neff of a pending entry returns the compiled artifact", "[fuse]") {
  Mount m;
  auto e = m.entry("rocm08_normal_9.hlo_proto.pb", "a+0");
  struct stat st {};
  REQUIRE(::stat((m.mnt() / e / "model.neff").c_str(), &st) == 0);  // listed before it exists
  CHECK(st.st_size == 0);
  CHECK(m.compiles() == 0);  // stat does not compile
  int fd = ::open((m.mnt() / e / "model.neff").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::fstat(fd, &st) == 0);
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  CHECK(st.st_size > 0);  // the true size once compiled
  CHECK(::read(fd, bytes.data(), bytes.size()) == st.st_size);
  ::close(fd);
  auto neff = fake::parse_fake_neff(bytes);
  REQUIRE(neff.has_value());
  CHECK(neff->graph == canonical_of("rocm08_normal_9.hlo_proto.pb"));
  CHECK(bytes == test::slurp(m.backing() / e / "model.neff"));
  CHECK(fs::exists(m.backing() / e / "model.done"));
  CHECK(m.compiles() == 1);
  // A second open is a plain hit.
  CHECK(read_all(m.mnt() / e / "model.neff").second == bytes);
  CHECK(m.compiles() == 1);
}

TEST_CASE("32 readers in 8 processes on one pending entry: one compile, identical bytes", "[fuse]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=0.5"});
  auto e = m.entry("spu_credit_fraud_test.hlo.pb", "b+0");
  test::TempDir out;
  std::vector<std::unique_ptr<test::Child>> procs;
  for (int p = 0; p < 8; ++p) {
    std::string script = fmt::format("for i in 1 2 3 4; do cat '{}' > '{}/{}.'$i & done; wait",
                                     (m.mnt() / e / "model.neff").string(), out.path().string(), p);
    procs.push_back(std::make_unique<test::Child>(std::vector<std::string>{"sh", "-c", script}));
  }
  for (auto& p : procs) CHECK(p->wait() == 0);
  std::string published = test::slurp(m.backing() / e / "model.neff");
  REQUIRE(fake::parse_fake_neff(published).has_value());
  int files = 0;
  for (const auto& f : fs::directory_iterator(out.path())) {
    ++files;
    CHECK(test::slurp(f.path()) == published);
  }
  CHECK(files == 32);
  CHECK(m.compiles() == 1);
}

TEST_CASE("two entries that differ only in debug information compile once", "[fuse]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=0.3"});
  auto a = m.entry("rocm_normal_9.hlo_proto.pb", "a+0");
  auto b = m.entry("rocm_normal_9.hlo_proto.pb", "b+0");
  // Entry b holds the same graph with every name and all metadata changed, as a second
  // run of the same training script writes it.
  neffcache_test::HloProto proto;
  REQUIRE(proto.ParseFromString(test::slurp(m.backing() / b / "model.hlo_module.pb")));
  auto* mod = proto.mutable_hlo_module();
  mod->set_name(mod->name() + "_run2");
  mod->set_id(mod->id() + 99);
  for (auto& comp : *mod->mutable_computations()) {
    comp.set_name(comp.name() + ".7");
    for (auto& ins : *comp.mutable_instructions()) {
      ins.set_name(ins.name() + ".7");
      ins.mutable_metadata()->set_source_file("/home/other-user/train.py");
      ins.mutable_metadata()->set_source_line(ins.metadata().source_line() + 3);
    }
  }
  std::string variant = proto.SerializeAsString();
  REQUIRE(variant != test::slurp(m.backing() / a / "model.hlo_module.pb"));
  test::spit(m.backing() / b / "model.hlo_module.pb", variant);
  // Catch2 assertions stay on this thread; the readers only record their errno.
  int err_a = -1, err_b = -1;
  std::thread ta([&] { err_a = read_all(m.mnt() / a / "model.neff").first; });
  std::thread tb([&] { err_b = read_all(m.mnt() / b / "model.neff").first; });
  ta.join();
  tb.join();
  CHECK(err_a == 0);
  CHECK(err_b == 0);
  CHECK(m.compiles() == 1);
  CHECK(test::slurp(m.backing() / a / "model.neff") == test::slurp(m.backing() / b / "model.neff"));
}

TEST_CASE("a compiler error: EIO, the log in model.log, no second compile, and retry works", "[fuse]") {
  test::TempDir gate_dir;
  auto gate = gate_dir / "failing";
  test::touch(gate);
  Mount m({"NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_FAIL_WHILE=" + gate.string()});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "c+0");
  CHECK(read_all(m.mnt() / e / "model.neff").first == EIO);
  CHECK(test::slurp(m.backing() / e / "model.log").find("injected compile failure") != std::string::npos);
  CHECK_FALSE(fs::exists(m.backing() / e / "model.neff"));
  CHECK(read_all(m.mnt() / e / "model.neff").first == EIO);  // at once, from the record
  CHECK(m.compiles() == 1);
  // Retry, as `neffcache retry` does: clear the failure record.
  fs::remove(gate);
  fs::remove(m.mnt() / e / "model.log");
  auto [err, bytes] = read_all(m.mnt() / e / "model.neff");
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(bytes).has_value());
  CHECK(m.compiles() == 2);
}

TEST_CASE("a compiler killed by a signal: EIO, nothing recorded, the next open compiles", "[fuse]") {
  test::TempDir marker_dir;
  Mount m({"NEFFCACHE_FAKE_SIGNAL_ONCE=" + (marker_dir / "died").string()});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "d+0");
  CHECK(read_all(m.mnt() / e / "model.neff").first == EIO);
  CHECK_FALSE(fs::exists(m.backing() / e / "model.log"));
  auto [err, bytes] = read_all(m.mnt() / e / "model.neff");
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(bytes).has_value());
  CHECK(m.compiles() == 2);
}

TEST_CASE("writing an HLO through the mount starts its compile with no reader", "[fuse]") {
  Mount m;
  auto dir = m.mnt() / "neuronxcc-2.21.0" / "MODULE_e+0";
  fs::create_directories(dir);
  test::spit(dir / "compile_flags.json", R"(["-O1"])");
  fs::copy_file(test::k_corpus / "spu_tf_jit_comp.hlo.pb", dir / "model.hlo_module.pb");
  auto done = m.backing() / "neuronxcc-2.21.0" / "MODULE_e+0" / "model.done";
  for (int i = 0; i < 1000 && !fs::exists(done); ++i) std::this_thread::sleep_for(10ms);
  CHECK(fs::exists(done));
  auto neff = fake::parse_fake_neff(test::slurp(m.backing() / "neuronxcc-2.21.0" / "MODULE_e+0" / "model.neff"));
  REQUIRE(neff.has_value());
  CHECK(neff->flags == R"(["--target=trn1", "-O1"])");
  CHECK(m.compiles() == 1);
}

TEST_CASE("an HLO whose writer was killed mid-write starts no compile; one closed or left at exit does", "[fuse]") {
  Mount m;
  const auto hlo = test::k_corpus / "rocm08_normal_9.hlo_proto.pb";
  for (std::string name : {"cut", "exited"}) fs::create_directories(m.mnt() / "neuronxcc-2.21.0" / ("MODULE_" + name));
  const auto cut = m.mnt() / "neuronxcc-2.21.0/MODULE_cut";
  const auto exited = m.mnt() / "neuronxcc-2.21.0/MODULE_exited";
  // Half the graph written, the file still open, then SIGKILL: the kernel closes it.
  test::Child writer({"sh", "-c", fmt::format("exec 3>'{}/model.hlo_module.pb'; head -c {} '{}' >&3; echo written; exec sleep 60",
                                              cut.string(), fs::file_size(hlo) / 2, hlo.string())});
  REQUIRE(writer.line() == "written");
  writer.kill(SIGKILL);
  writer.wait();
  // A whole graph whose writer exits without closing it: the exit closes it.
  REQUIRE(test::run({"sh", "-c", fmt::format("exec 3>'{}/model.hlo_module.pb'; cat '{}' >&3; exit 0", exited.string(),
                                             (test::k_corpus / "gopjrt_tuple.hlo.pb").string())})
              .exit_code == 0);
  // (model.done is looked for in the backing directory: the mount shows a placeholder.)
  const auto done = [&](const char* entry) { return fs::exists(m.backing() / "neuronxcc-2.21.0" / entry / "model.done"); };
  for (int i = 0; i < 500 && !done("MODULE_exited"); ++i) std::this_thread::sleep_for(10ms);
  CHECK(done("MODULE_exited"));
  std::this_thread::sleep_for(300ms);
  CHECK(m.compiles() == 1);  // the exited writer's graph only
  CHECK_FALSE(fs::exists(m.backing() / "neuronxcc-2.21.0/MODULE_cut/model.log"));  // nothing recorded
  // The client runs again and writes the whole graph: that compiles.
  write_plain(cut / "model.hlo_module.pb", test::slurp(hlo));
  for (int i = 0; i < 500 && !done("MODULE_cut"); ++i) std::this_thread::sleep_for(10ms);
  CHECK(done("MODULE_cut"));
  CHECK(m.compiles() == 2);
}

TEST_CASE("the same random file operations on the mount and on a plain directory agree", "[fuse]") {
  Mount m;
  test::TempDir plain;
  // Runs a seeded sequence of operations under `root`, recording what each returned.
  auto replay = [](const fs::path& root) {
    std::mt19937 rng(4242);
    std::ostringstream log;
    std::vector<std::string> names{"a", "b", "c", "d/x", "d/y", "e"};
    auto pick = [&] { return root / names[rng() % names.size()]; };
    for (int step = 0; step < 400; ++step) {
      auto p = pick(), q = pick();
      int rc = 0;
      std::string data;
      switch (rng() % 12) {
        case 0: rc = ::mkdir((root / "d").c_str(), 0755); break;
        case 1: {
          int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          rc = fd;
          if (fd >= 0) {
            std::string text(rng() % 5000, static_cast<char>('a' + rng() % 26));
            rc = static_cast<int>(::write(fd, text.data(), text.size()));
            ::close(fd);
          }
          break;
        }
        case 2: {
          int fd = ::open(p.c_str(), O_WRONLY | O_APPEND);
          rc = fd < 0 ? fd : static_cast<int>(::write(fd, "tail", 4));
          if (fd >= 0) ::close(fd);
          break;
        }
        case 3: {
          auto r = read_all(p);
          rc = r.first;
          data = std::to_string(r.second.size()) + ":" + std::to_string(std::hash<std::string>{}(r.second));
          break;
        }
        case 4: rc = ::rename(p.c_str(), q.c_str()); break;
        case 5: rc = ::unlink(p.c_str()); break;
        case 6: rc = ::rmdir((root / "d").c_str()); break;
        case 7: rc = ::truncate(p.c_str(), static_cast<off_t>(rng() % 100)); break;
        case 8: rc = ::symlink("target-text", p.c_str()); break;
        case 9: {
          char buf[64] = {};
          rc = static_cast<int>(::readlink(p.c_str(), buf, sizeof buf - 1));
          data = buf;
          break;
        }
        case 10: rc = ::link(p.c_str(), q.c_str()); break;
        case 11: {
          struct stat st {};
          rc = ::lstat(p.c_str(), &st);
          if (rc == 0) data = fmt::format("{:o} {} {}", st.st_mode, S_ISDIR(st.st_mode) ? 0 : st.st_size, st.st_nlink);
          break;
        }
      }
      log << step << ' ' << (rc < 0 ? -errno : 0) << ' ' << data << '\n';
    }
    return log.str();
  };
  // Names, types and contents of everything under a root.
  auto tree = [](const fs::path& root) {
    std::vector<std::string> out;
    for (const auto& f : fs::recursive_directory_iterator(root)) {
      std::string line = fs::relative(f.path(), root).string();
      if (f.is_symlink()) line += " -> " + fs::read_symlink(f.path()).string();
      else if (f.is_regular_file()) line += " = " + std::to_string(std::hash<std::string>{}(test::slurp(f.path())));
      out.push_back(line);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  std::string on_mount = replay(m.mnt());
  std::string on_plain = replay(plain.path());
  CHECK(on_mount == on_plain);
  CHECK(on_mount.find(" 0 ") != std::string::npos);  // some operations succeeded...
  CHECK(on_mount.find(" -2 ") != std::string::npos);  // ...and some failed with ENOENT, alike
  auto expected = tree(plain.path());
  CHECK(expected.size() >= 3);
  CHECK(tree(m.mnt()) == expected);
  CHECK(tree(m.backing()) == expected);  // the mount wrote through
}

TEST_CASE("neffcachefs refuses bad start-up conditions with one line", "[fuse]") {
  test::TempDir dir;
  fs::create_directories(dir / "backing");
  fs::create_directories(dir / "mnt");
  auto start = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{k_daemon, "--foreground"};
    argv.insert(argv.end(), args.begin(), args.end());
    return test::run(argv);
  };
  auto fake = k_fake + " {hlo} --output {neff}";
  auto r = start({"--compiler", fake, (dir / "backing").string(), (dir / "missing").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("mount point") != std::string::npos);
  r = start({"--compiler", fake, (dir / "nope").string(), (dir / "mnt").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("backing directory") != std::string::npos);
  r = start({"--compiler", "no-such-compiler {hlo} {neff}", (dir / "backing").string(), (dir / "mnt").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output == "neffcachefs: error: compiler 'no-such-compiler' not found on PATH\n");
  r = start({"--compiler", "cc {hlo}", (dir / "backing").string(), (dir / "mnt").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("bad compiler template") != std::string::npos);
  Mount busy;
  r = start({"--compiler", fake, (dir / "backing").string(), busy.mnt().string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("busy") != std::string::npos);
}

TEST_CASE("a mount point given relative to the working directory is unmounted at SIGTERM", "[fuse]") {
  // libfuse moves the daemon to / before it serves: a relative path would name nothing then.
  test::TempDir dir;
  fs::create_directories(dir / "backing");
  fs::create_directories(dir / "mnt");
  test::Child daemon({"env", "-C", dir.path().string(), k_daemon, "--foreground", "--compiler",
                      k_fake + " {hlo} --output {neff}", "backing", "mnt"});
  test::await_mount(dir / "mnt");
  daemon.kill(SIGTERM);
  CHECK(daemon.wait() == 0);
  CHECK_FALSE(mounted(dir / "mnt"));
  if (mounted(dir / "mnt")) ::umount2((dir / "mnt").c_str(), MNT_DETACH);
}

TEST_CASE("two daemons on one backing directory, readers on both: one compile", "[fuse]") {
  test::TempDir shared;
  Mount a({"NEFFCACHE_FAKE_SECONDS=0.5"}, {}, shared.path());
  Mount b({"NEFFCACHE_FAKE_SECONDS=0.5", "NEFFCACHE_FAKE_LOG=" + a.compile_log().string()}, {}, shared.path());
  auto e = a.entry("spu_credit_fraud_predict.hlo.pb", "two+0");
  std::vector<std::unique_ptr<test::Child>> readers;
  for (int i = 0; i < 4; ++i) {
    readers.push_back(reader_process(a.mnt() / e / "model.neff"));
    readers.push_back(reader_process(b.mnt() / e / "model.neff"));
  }
  for (auto& r : readers) CHECK(r->wait() == 0);
  CHECK(a.compiles() == 1);
}

TEST_CASE("two daemons and neffcache compile on one backing directory, one daemon killed mid-compile: "
          "every entry compiled once, taken over, never twice at once", "[fuse]") {
  test::TempDir shared, exclusive, logs;
  // Each compile holds an flock named after its entry while it runs: a second one at once
  // would record a clash (fake-neuronx-cc, NEFFCACHE_FAKE_EXCLUSIVE_DIR).
  const std::vector<std::string> env{"NEFFCACHE_FAKE_SECONDS=1", "NEFFCACHE_FAKE_EXCLUSIVE_DIR=" + exclusive.path().string()};
  auto with = [&](std::vector<std::string> v, const fs::path& log) {
    v.push_back("NEFFCACHE_FAKE_LOG=" + log.string());
    return v;
  };
  Mount a(with(env, logs / "a"), {}, shared.path());
  Mount b(with(env, logs / "b"), {}, shared.path());
  const std::vector<std::string> graphs{"rocm08_normal_9.hlo_proto.pb", "gopjrt_tuple.hlo.pb", "gopjrt_x_squared.hlo.pb",
                                        "spu_credit_fraud_predict.hlo.pb", "rocm_normal_11.hlo_proto.pb", "rocm08_dot_5.hlo_proto.pb"};
  std::vector<std::string> entries;
  for (std::size_t i = 0; i < graphs.size(); ++i) entries.push_back(a.entry(graphs[i], fmt::format("dual{}", i)));
  std::vector<std::unique_ptr<test::Child>> on_a, on_b;
  for (const auto& e : entries) {
    on_a.push_back(reader_process(a.mnt() / e / "model.neff"));
    on_b.push_back(reader_process(b.mnt() / e / "model.neff"));
  }
  std::vector<std::string> argv{"env", "TMPDIR=" + logs.path().string(), "NEFFCACHE_FAKE_RATE=0"};
  for (const auto& v : with(env, logs / "tool")) argv.push_back(v);
  for (std::string v : {test::k_tool, std::string("compile"), std::string("--cache"), shared.path().string(), std::string("-j"),
                        std::string("2"), std::string("--compiler"), k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}"})
    argv.push_back(v);
  test::Child tool(argv);
  auto log = [&](const char* who) { return fs::exists(logs / who) ? test::slurp(logs / who) : std::string(); };

  // Kill daemon a while a compile of its own runs.
  pid_t running = 0;
  for (int i = 0; i < 1000 && running == 0; ++i) {
    std::istringstream lines(log("a"));
    for (std::string line; std::getline(lines, line);)
      if (pid_t pid = std::stoi(line); ::kill(pid, 0) == 0) running = pid;
    if (running == 0) std::this_thread::sleep_for(5ms);
  }
  REQUIRE(running != 0);
  const std::string killed_line = [&] {
    std::istringstream lines(log("a"));
    for (std::string line; std::getline(lines, line);)
      if (std::stoi(line) == running) return line;
    return std::string();
  }();
  CHECK(a.stop(SIGKILL) == -SIGKILL);
  for (auto& r : on_a) r->wait();  // whole, or cut off with the daemon
  for (auto& r : on_b) CHECK(r->wait() == 0);
  CHECK(tool.wait() == 0);

  CHECK_FALSE(fs::exists(exclusive / "clashes"));
  const std::string all = log("a") + log("b") + log("tool");
  const std::string by_a = log("a");
  auto count = [](const std::string& text, const std::string& key) {
    int n = 0;
    for (auto at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) ++n;
    return n;
  };
  for (const auto& e : entries) {
    const std::string key = "model." + fs::path(e).filename().string() + ".";
    INFO(e);
    CHECK(fake::parse_fake_neff(test::slurp(shared.path() / e / "model.neff")).has_value());
    CHECK(fs::exists(shared.path() / e / "model.done"));
    CHECK_FALSE(fs::exists(shared.path() / e / "model.hlo_module.pb.lock"));
    // Once; twice when daemon a's compile died with it and someone took the entry over.
    const int total = count(all, key);
    if (killed_line.find(key) != std::string::npos) CHECK(total == 2);
    else if (count(by_a, key) > 0) CHECK(total <= 2);  // a's other compile: it finished, or died too
    else CHECK(total == 1);
  }
}

TEST_CASE("a waiting reader that is killed exits within a second", "[fuse]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=20"});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "slow+0");
  auto reader = reader_process(m.mnt() / e / "model.neff");
  for (int i = 0; i < 500 && m.compiles() == 0; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(m.compiles() == 1);  // the reader is now waiting on the compile
  auto start = std::chrono::steady_clock::now();
  reader->kill(SIGKILL);
  CHECK(reader->wait() == -SIGKILL);
  // Asserted: it ends, long before the 20 s compile would. The goal (under a second)
  // is reported, not asserted: a loaded CI machine must not turn timing into failures.
  std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
  CHECK(took < 10s);
  WARN(fmt::format("a killed waiting reader exited after {:.1f} ms (goal: under 1000 ms)", took.count()));
}

TEST_CASE("a daemon that goes to the background compiles and stops", "[fuse]") {
  // Without -f the daemon forks after mounting. Its threads used to start before the
  // fork, which kept only the main thread: every open of a pending NEFF then hung.
  test::TempDir dir;
  fs::create_directories(dir / "mnt");
  const std::string rel = "neuronxcc-2.21.0/MODULE_bg+0";
  fs::create_directories(dir / "backing" / rel);
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", dir / "backing" / rel / "model.hlo_module.pb");
  auto started = test::run({NEFFCACHE_DAEMON, "--compiler", k_fake + " compile --framework=XLA --target=trn1 {hlo} "
                            "--output {neff} {flags}", (dir / "backing").string(), (dir / "mnt").string()});
  REQUIRE(started.exit_code == 0);
  auto read = test::run({"timeout", "30", "cat", (dir / "mnt" / rel / "model.neff").string()});
  CHECK(read.exit_code == 0);
  CHECK(fake::parse_fake_neff(read.output).has_value());
  CHECK(test::run({"fusermount3", "-u", (dir / "mnt").string()}).exit_code == 0);
}

TEST_CASE("only the daemon's main thread takes stop signals", "[fuse]") {
  // libfuse ends its loop on SIGTERM, SIGINT or SIGHUP only when its handler runs in the
  // main thread. A stop signal taken by any other thread left the daemon running until
  // the next request, and the 10,000-entry burst test hung twice that way.
  Mount m({"NEFFCACHE_FAKE_SECONDS=0.2"});
  auto rel = m.entry("gopjrt_tuple.hlo.pb", "sig+0");
  REQUIRE(read_all(m.mnt() / rel / "model.neff").first == 0);  // every kind of thread has run
  const pid_t pid = m.daemon().pid();
  constexpr unsigned long long k_stop = (1ull << (SIGHUP - 1)) | (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1));
  int others = 0;
  for (const auto& task : fs::directory_iterator(fmt::format("/proc/{}/task", pid))) {
    std::istringstream status(test::slurp(task.path() / "status"));
    unsigned long long blocked = 0;
    for (std::string line; std::getline(status, line);)
      if (line.starts_with("SigBlk:")) blocked = std::stoull(line.substr(7), nullptr, 16);
    const bool main_thread = task.path().filename() == std::to_string(pid);
    INFO(task.path().filename().string());
    if (main_thread) {
      CHECK((blocked & k_stop) == 0);
    } else {
      CHECK((blocked & k_stop) == k_stop);
      ++others;
    }
  }
  CHECK(others >= 4);  // prepare, reap, compile workers, FUSE workers
  CHECK(m.stop(SIGTERM) == 0);
}

TEST_CASE("SIGTERM answers every waiter, records nothing and unmounts", "[fuse]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=30"});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "term+0");
  std::vector<std::unique_ptr<test::Child>> readers;
  for (int i = 0; i < 3; ++i) readers.push_back(reader_process(m.mnt() / e / "model.neff"));
  // Every reader must be waiting: one that opens after the unmount gets another error.
  auto waiting = [&] {
    std::ifstream in(m.mnt() / ".neffcache" / "stats.json");
    return nlohmann::json::parse(in)["waiters"].get<int>();
  };
  for (int i = 0; i < 1000 && (m.compiles() == 0 || waiting() < 3); ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(m.compiles() == 1);
  REQUIRE(waiting() == 3);
  // An open whose RELEASE the daemon never sees (the mount goes first): under ASan, the
  // daemon's exit status shows whether its snapshot leaked.
  std::ifstream held(m.mnt() / ".neffcache" / "stats.json");
  REQUIRE(held.is_open());
  auto start = std::chrono::steady_clock::now();
  CHECK(m.stop(SIGTERM) == 0);
  for (auto& r : readers) CHECK(r->wait() == 5);  // EIO: the compile was stopped
  CHECK(std::chrono::steady_clock::now() - start < 15s);
  CHECK_FALSE(mounted(m.mnt()));
  CHECK_FALSE(fs::exists(m.backing() / e / "model.log"));
  CHECK_FALSE(fs::exists(m.backing() / e / "model.hlo_module.pb.lock"));
}

TEST_CASE("kill -9 of the daemon mid-compile, lazy unmount, restart: compiled and served whole", "[fuse]") {
  test::TempDir shared;
  std::string e;
  {
    Mount first({"NEFFCACHE_FAKE_SECONDS=2"}, {}, shared.path());
    e = first.entry("rocm_normal_11.hlo_proto.pb", "crash+0");
    auto reader = reader_process(first.mnt() / e / "model.neff");
    for (int i = 0; i < 500 && first.compiles() == 0; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(first.compiles() == 1);
    CHECK(first.stop(SIGKILL) == -SIGKILL);
    CHECK(reader->wait() != 0);  // ECONNABORTED or ENOTCONN: the daemon is gone
  }  // lazy unmount
  Mount second({"NEFFCACHE_FAKE_RATE=0"}, {}, shared.path());
  CHECK(reader_process(second.mnt() / e / "model.neff")->wait() == 0);  // whole, checked
  CHECK(fake::parse_fake_neff(test::slurp(shared.path() / e / "model.neff")).has_value());
}

TEST_CASE("a compiler and its children die with a killed daemon; the next daemon compiles alone", "[fuse]") {
  test::TempDir shared;
  std::string e;
  {
    // The compiler hangs, and so does a child it starts in its process group.
    Mount first({"NEFFCACHE_FAKE_HANG=1"}, {}, shared.path());
    e = first.entry("gopjrt_tuple.hlo.pb", "orphan+0");
    auto reader = reader_process(first.mnt() / e / "model.neff");
    for (int i = 0; i < 500 && first.compiles() == 0; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(first.compiles() == 1);
    const pid_t group = std::stoi(test::slurp(first.compile_log()));  // the group's leader
    CHECK_FALSE(test::no_process_in_group(group));
    CHECK(first.stop(SIGKILL) == -SIGKILL);
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) std::this_thread::sleep_for(10ms), gone = test::no_process_in_group(group);
    CHECK(gone);
    reader->wait();
  }
  auto lock = inspect_lock((shared.path() / e / "model.hlo_module.pb.lock").string());
  REQUIRE(lock.has_value());
  CHECK(lock->state == LockState::stale);  // its owner and the compiler are gone
  Mount second({}, {}, shared.path());
  CHECK(reader_process(second.mnt() / e / "model.neff")->wait() == 0);
  CHECK(test::count_lines(second.compile_log()) == 1);
}

TEST_CASE("kill -9 of the daemon at random moments, 100 cycles: no partial NEFF, every entry ends whole", "[fuse][load]") {
  test::TempDir shared;
  std::mt19937 rng(20261122);
  const std::vector<std::string> graphs{"rocm08_normal_9.hlo_proto.pb", "gopjrt_tuple.hlo.pb", "gopjrt_x_squared.hlo.pb"};
  std::vector<std::string> entries;
  int whole = 0, cut_off = 0;
  // The kill moments must reach past the answer, and how long an answer takes depends on
  // the build: under ASan a compile of 110 ms is answered after about 300 ms. Cycle 0
  // measures it, with the slowest compile, and is killed only after its answer.
  std::chrono::milliseconds answer_after{0};
  for (int cycle = 0; cycle < 100; ++cycle) {
    // Compiles of 20 to 110 ms and NEFFs of 1 MiB, killed from 0 to 1.5 times the measured
    // answer after the open: before, during and after the compile, the publish and the answer.
    const double seconds = cycle == 0 ? 0.11 : 0.02 + static_cast<double>(rng() % 10) / 100;
    Mount m({fmt::format("NEFFCACHE_FAKE_SECONDS={}", seconds), "NEFFCACHE_FAKE_NEFF_BYTES=1048576"}, {},
            shared.path());
    entries.push_back(m.entry(graphs[static_cast<std::size_t>(cycle) % graphs.size()], fmt::format("kill{}+0", cycle)));
    const auto opened = std::chrono::steady_clock::now();
    auto reader = reader_process(m.mnt() / entries.back() / "model.neff");
    int rc = 0;
    if (cycle == 0) {
      REQUIRE((rc = reader->wait()) == 0);
      answer_after = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - opened);
      m.stop(SIGKILL);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % (answer_after.count() * 3 / 2 + 1)));
      m.stop(SIGKILL);
      rc = reader->wait();
    }
    INFO("cycle " << cycle << ": the reader exited with " << rc);
    CHECK((rc == 0 || rc == 3));  // whole, or the connection was cut; never partial (2)
    (rc == 0 ? whole : cut_off) += 1;
  }  // each mount is lazily unmounted
  INFO(fmt::format("answered {} ms after the open; {} whole, {} cut off", answer_after.count(), whole, cut_off));
  CHECK(whole > 1);  // more than cycle 0
  CHECK(cut_off > 0);
  // A last daemon serves every entry whole, with its own graph.
  Mount last({"NEFFCACHE_FAKE_RATE=0"}, {}, shared.path());
  for (std::size_t k = 0; k < entries.size(); ++k) {
    INFO(entries[k]);
    auto [err, bytes] = read_all(last.mnt() / entries[k] / "model.neff");
    REQUIRE(err == 0);
    auto neff = fake::parse_fake_neff(bytes);
    REQUIRE(neff.has_value());
    CHECK(neff->graph == canonical_of(graphs[k % graphs.size()]));
  }
  // And nothing is left behind: the next compile of an entry removes the half-written
  // copies of a killed publisher, and the lock of a publisher killed after its NEFF was
  // in place goes when the entry is looked up.
  std::vector<std::string> leftovers;
  for (const auto& f : fs::recursive_directory_iterator(shared.path())) {
    auto name = f.path().filename().string();
    if (name.starts_with(".neffcache-neff-") || name.starts_with(".neffcache-log-") || name.ends_with(".lock"))
      leftovers.push_back(fs::relative(f.path(), shared.path()).string());
  }
  INFO(fmt::format("{}", fmt::join(leftovers, ", ")));
  CHECK(leftovers.empty());
}

TEST_CASE("a full backing disk at publish: EIO, nothing partial or recorded; once space is freed the next open compiles", "[fuse]") {
  test::Tmpfs disk("8m");
  Mount m({"NEFFCACHE_FAKE_NEFF_BYTES=3145728"}, {}, disk.path());
  auto e = m.entry("gopjrt_tuple.hlo.pb", "full+0");
  write_plain(disk / "filler", std::string(7 << 20, 'x'));  // leaves less than the NEFF's 3 MiB
  CHECK(read_all(m.mnt() / e / "model.neff").first == EIO);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(disk / e)) left.push_back(f.path().filename().string());
  std::sort(left.begin(), left.end());
  // The HLO and the compile's own log; no NEFF, no temp copy, no failure record.
  CHECK(left == std::vector<std::string>{".neffcache-compile.log", "model.hlo_module.pb"});
  fs::remove(disk / "filler");
  auto [err, bytes] = read_all(m.mnt() / e / "model.neff");
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(bytes).has_value());
  CHECK(m.compiles() == 2);
}

TEST_CASE("counters are readable while mounted and are not in the backing store", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_x_squared.hlo.pb", "stats+0");
  CHECK(read_all(m.mnt() / e / "model.neff").first == 0);  // a miss: compiles
  CHECK(read_all(m.mnt() / e / "model.neff").first == 0);  // a hit
  auto [err, text] = read_all(m.mnt() / ".neffcache" / "stats.json");
  REQUIRE(err == 0);
  auto j = nlohmann::json::parse(text);
  CHECK(j["misses"] == 1);
  CHECK(j["hits"] == 1);
  CHECK(j["waiters"] == 0);
  CHECK(j["compiles"]["started"] == 1);
  CHECK(j["compiles"]["succeeded"] == 1);
  CHECK(j["entries"]["done"] == 1);
  CHECK(j["eio"]["01"] == 0);
  CHECK_FALSE(fs::exists(m.backing() / ".neffcache"));
  int fd = ::open((m.mnt() / ".neffcache" / "stats.json").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(::fsync(fd) == 0);
  CHECK(::close(fd) == 0);  // its handle is no descriptor: flush must not treat it as one
  CHECK(::open((m.mnt() / ".neffcache" / "stats.json").c_str(), O_WRONLY) < 0);
  CHECK(errno == EACCES);
  CHECK(::mkdir((m.mnt() / ".neffcache" / "x").c_str(), 0755) < 0);
}

TEST_CASE("stats.json read in pieces while counters move is the document of its open", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_x_squared.hlo.pb", "pieces+0");
  REQUIRE(read_all(m.mnt() / e / "model.neff").first == 0);  // a miss
  int fd = ::open((m.mnt() / ".neffcache" / "stats.json").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  char buf[7];
  std::string text(buf, static_cast<std::size_t>(std::max<ssize_t>(0, ::read(fd, buf, sizeof buf))));
  for (int i = 0; i < 12; ++i) REQUIRE(read_all(m.mnt() / e / "model.neff").first == 0);  // hits: 0 -> 12
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  REQUIRE(nlohmann::json::accept(text));
  CHECK(nlohmann::json::parse(text)["hits"] == 0);  // as at the open, not pieces of a later text
  CHECK(nlohmann::json::parse(read_all(m.mnt() / ".neffcache" / "stats.json").second)["hits"] == 12);
}

TEST_CASE("a wait past --wait-timeout fails with EIO while the compile goes on", "[fuse]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=5"}, {"--wait-timeout", "0.5"});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "deadline+0");
  auto start = std::chrono::steady_clock::now();
  CHECK(reader_process(m.mnt() / e / "model.neff")->wait() == 5);  // EIO
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK_FALSE(fs::exists(m.backing() / e / "model.done"));  // answered before the compile ended
  auto j = nlohmann::json::parse(read_all(m.mnt() / ".neffcache" / "stats.json").second);
  CHECK(j["eio"]["05"] == 1);
  CHECK(j["waiters"] == 0);
  // The compile was not abandoned: it finishes, and the next open is a hit.
  for (int i = 0; i < 2000 && !fs::exists(m.backing() / e / "model.done"); ++i) std::this_thread::sleep_for(10ms);
  CHECK(reader_process(m.mnt() / e / "model.neff")->wait() == 0);
  CHECK(m.compiles() == 1);
}

TEST_CASE("listings answer with attributes (readdirplus) and every reference is given back", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_tuple.hlo.pb", "list+0");
  const fs::path many = m.backing() / "many";
  fs::create_directories(many);
  for (int i = 0; i < 2000; ++i) write_plain(many / fmt::format("f{:04}", i), std::string(static_cast<std::size_t>(i % 97), 'x'));
  // Descriptors the daemon holds for backing files (libfuse adds splice pipes per worker).
  auto daemon_fds = [&] {
    int n = 0;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(fmt::format("/proc/{}/fd", m.daemon().pid())))
      n += fs::read_symlink(f.path(), ec).string().starts_with(m.backing().string());
    return n;
  };
  auto forget_all = [] {
    ::sync();
    write_plain("/proc/sys/vm/drop_caches", "2");  // the kernel forgets dentries and inodes
  };
  forget_all();
  const auto base = daemon_fds();
  // A listing alone: the first batch arrives with attributes, so names were looked up.
  std::vector<std::string> names;
  for (const auto& f : fs::directory_iterator(m.mnt() / "many")) names.push_back(f.path().filename().string());
  CHECK(names.size() == 2000);
  CHECK(daemon_fds() > base + 10);
  // `ls -l`: the same sizes and modes as the backing directory.
  int same = 0;
  for (const auto& n : names) {
    struct stat a {}, b {};
    REQUIRE(::lstat((m.mnt() / "many" / n).c_str(), &a) == 0);
    REQUIRE(::lstat((many / n).c_str(), &b) == 0);
    same += a.st_size == b.st_size && a.st_mode == b.st_mode && a.st_mtim.tv_sec == b.st_mtim.tv_sec;
  }
  CHECK(same == 2000);
  CHECK(daemon_fds() > base + 1900);
  // A pending entry lists its placeholders, stat-able at size 0, without compiling.
  std::map<std::string, off_t> sizes;
  for (const auto& f : fs::directory_iterator(m.mnt() / e)) sizes[f.path().filename().string()] = static_cast<off_t>(fs::file_size(f.path()));
  CHECK(sizes.size() == 3);
  CHECK(sizes["model.neff"] == 0);
  CHECK(sizes["model.done"] == 0);
  CHECK(m.compiles() == 0);
  // When the kernel forgets the names, the daemon closes what it held for them.
  for (int i = 0; i < 30 && daemon_fds() > base; ++i) {
    forget_all();  // again if a name was busy the first time
    std::this_thread::sleep_for(100ms);
  }
  CHECK(daemon_fds() == base);
}

TEST_CASE("far more names than the daemon may open files: each one answers, renamed or replaced", "[fuse]") {
  // 300 descriptors: the daemon keeps 150 names open; the kernel will remember 6,000.
  Mount m({}, {}, std::nullopt, {"prlimit", "--nofile=300:300", "--"});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "pending+0");
  const int dirs = 50, files = 120;
  for (int d = 0; d < dirs; ++d) {
    fs::create_directories(m.backing() / "tree" / fmt::format("d{:02}", d));
    for (int f = 0; f < files; ++f)
      write_plain(m.backing() / "tree" / fmt::format("d{:02}/f{:03}", d, f), fmt::format("{}/{}", d, f));
  }
  auto contents = [&](const fs::path& p) { return read_all(p).second; };
  // A walk: every name once, with attributes, as `find` or `du` does it.
  int seen = 0;
  for (const auto& f : fs::recursive_directory_iterator(m.mnt() / "tree")) seen += f.is_regular_file();
  CHECK(seen == dirs * files);
  // Every name again, the early ones long since let go: stat and read agree with the backing.
  int same = 0;
  for (int d = 0; d < dirs; ++d)
    for (int f = 0; f < files; ++f) {
      auto rel = fmt::format("tree/d{:02}/f{:03}", d, f);
      struct stat a {}, b {};
      REQUIRE(::stat((m.mnt() / rel).c_str(), &a) == 0);
      REQUIRE(::stat((m.backing() / rel).c_str(), &b) == 0);
      same += a.st_size == b.st_size && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
              contents(m.mnt() / rel) == fmt::format("{}/{}", d, f);
    }
  CHECK(same == dirs * files);
  // A folder renamed through the mount: the files below it, reopened, come from its new place.
  int held = ::open((m.mnt() / "tree/d00/f000").c_str(), O_RDONLY);
  REQUIRE(held >= 0);
  REQUIRE(::rename((m.mnt() / "tree/d00").c_str(), (m.mnt() / "tree/moved").c_str()) == 0);
  for (int f = 0; f < files; ++f) CHECK(contents(m.mnt() / fmt::format("tree/d01/f{:03}", f)) == fmt::format("1/{}", f));
  struct stat st {};
  CHECK(::fstat(held, &st) == 0);  // by the open file, whatever its name
  CHECK(contents(m.mnt() / "tree/moved/f005") == "0/5");
  ::close(held);
  // Replaced behind the daemon's back (a publish renames a new file over the old one):
  // the kernel is told the old one is stale and looks the name up again.
  write_plain(m.backing() / "tree/new", "replaced");
  fs::rename(m.backing() / "tree/new", m.backing() / "tree/d02/f000");
  for (int f = 0; f < files; ++f) contents(m.mnt() / fmt::format("tree/d03/f{:03}", f));  // let d02/f000 go
  REQUIRE(::stat((m.mnt() / "tree/d02/f000").c_str(), &st) == 0);
  CHECK(st.st_size == 8);
  CHECK(contents(m.mnt() / "tree/d02/f000") == "replaced");
  // Compiling on open still works with the limit.
  auto [err, neff] = read_all(m.mnt() / e / "model.neff");
  CHECK(err == 0);
  CHECK(m.compiles() == 1);
  CHECK(neff == test::slurp(m.backing() / e / "model.neff"));
}

TEST_CASE("a done entry removed or repaired behind the daemon's back is seen anew through the mount", "[fuse]") {
  // The kernel keeps a done entry's names for a day; what it remembers must not outlive the files.
  Mount m;
  auto e = m.entry("rocm08_normal_9.hlo_proto.pb", "gone+0");
  auto graph_of = [&](const fs::path& p) {
    auto neff = fake::parse_fake_neff(read_all(p).second);
    return neff ? neff->graph : std::string("not a whole NEFF");
  };
  CHECK(graph_of(m.mnt() / e / "model.neff") == canonical_of("rocm08_normal_9.hlo_proto.pb"));
  REQUIRE(fs::exists(m.mnt() / e / "model.done"));
  // Removed and written again as a pending entry of another graph, as after `neffcache
  // clean` and a new trial run.
  fs::remove_all(m.backing() / e);
  fs::create_directories(m.backing() / e);
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", m.backing() / e / "model.hlo_module.pb");
  CHECK(graph_of(m.mnt() / e / "model.neff") == canonical_of("gopjrt_tuple.hlo.pb"));
  CHECK(m.compiles() == 2);
  // A client can create files in it (its lock) and list it.
  int fd = ::open((m.mnt() / e / "extra").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  CHECK(fd >= 0);
  if (fd >= 0) ::close(fd);
  std::set<std::string> names;
  for (const auto& f : fs::directory_iterator(m.mnt() / e))
    if (!f.path().filename().string().starts_with(".neffcache")) names.insert(f.path().filename().string());
  CHECK(names == std::set<std::string>{"model.hlo_module.pb", "model.neff", "model.done", "extra"});
  // Repaired (model.neff and model.done removed, as `neffcache verify --repair` does): the
  // next open compiles again instead of serving the removed file.
  fs::remove(m.backing() / e / "model.done");
  fs::remove(m.backing() / e / "model.neff");
  CHECK(graph_of(m.mnt() / e / "model.neff") == canonical_of("gopjrt_tuple.hlo.pb"));
  CHECK(m.compiles() == 3);
}

TEST_CASE("corrupt, empty and non-HLO graphs fail cleanly, each on its own", "[fuse]") {
  Mount m;
  const std::string real = test::slurp(test::k_corpus / "rocm08_normal_9.hlo_proto.pb");
  const std::map<std::string, std::string> bad{
      {"empty+0", ""}, {"text+0", "hello, not a graph\n"}, {"cut+0", real.substr(0, real.size() / 2)},
      {"noise+0", std::string(4096, '\xa5')}};
  for (const auto& [name, bytes] : bad) {
    fs::create_directories(m.backing() / "neuronxcc-2.21.0" / ("MODULE_" + name));
    write_plain(m.backing() / "neuronxcc-2.21.0" / ("MODULE_" + name) / "model.hlo_module.pb", bytes);
  }
  auto good = m.entry("gopjrt_tuple.hlo.pb", "good+0");
  for (const auto& [name, bytes] : bad) {
    INFO(name);
    const fs::path entry = fs::path("neuronxcc-2.21.0") / ("MODULE_" + name);
    CHECK(read_all(m.mnt() / entry / "model.neff").first == EIO);
    CHECK(test::slurp(m.backing() / entry / "model.log").size() > 0);  // the compiler's reason
    CHECK_FALSE(fs::exists(m.backing() / entry / "model.neff"));       // nothing partial
    CHECK_FALSE(fs::exists(m.backing() / entry / "model.done"));
    CHECK(test::slurp(m.backing() / entry / "model.hlo_module.pb") == bytes);  // the input untouched
  }
  const int compiles = m.compiles();
  CHECK(compiles == static_cast<int>(bad.size()));
  for (const auto& [name, bytes] : bad)  // recorded: no second compile
    CHECK(read_all(m.mnt() / "neuronxcc-2.21.0" / ("MODULE_" + name) / "model.neff").first == EIO);
  CHECK(m.compiles() == compiles);
  auto [err, neff] = read_all(m.mnt() / good / "model.neff");  // the good one is not disturbed
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(neff).has_value());
}

TEST_CASE("a FIFO as the HLO fails its entry at once and stalls nothing else", "[fuse]") {
  Mount m;
  const fs::path fifo = fs::path("neuronxcc-2.21.0") / "MODULE_fifo+0";
  fs::create_directories(m.backing() / fifo);
  // Opened as a plain file, a FIFO without a writer blocks for ever: before, the one
  // thread that prepares compiles did, and every later open waited behind it.
  REQUIRE(::mkfifo((m.backing() / fifo / "model.hlo_module.pb").c_str(), 0644) == 0);
  auto good = m.entry("gopjrt_tuple.hlo.pb", "good+0");
  auto reader = reader_process(m.mnt() / fifo / "model.neff");
  CHECK(read_all(m.mnt() / good / "model.neff").first == 0);
  CHECK(reader->wait() == 5);  // EIO
  CHECK(test::slurp(m.backing() / fifo / "model.log").find("not a regular file") != std::string::npos);
  CHECK(m.compiles() == 1);  // the good one; the FIFO was never handed to a compiler
}

TEST_CASE("a daemon with --compiler-user runs compiles as that user; the NEFF is the HLO owner's; bad uses are refused", "[fuse]") {
  REQUIRE(::geteuid() == 0);  // the CI machines run the tests as root
  // Everything the compiler reaches must be open to nobody: its program, the work root
  // and the compile log (a TempDir is 0700).
  test::TempDir bin;
  fs::permissions(bin.path(), fs::perms(0755));
  fs::copy_file(k_fake, bin / "fake-neuronx-cc");
  Mount m({}, {"--compiler-user", "nobody"}, std::nullopt, {}, (bin / "fake-neuronx-cc").string());
  const fs::path dir = m.compile_log().parent_path();
  fs::permissions(dir, fs::perms(0755));
  test::spit(m.compile_log(), "");
  fs::permissions(m.compile_log(), fs::perms(0666));
  auto e = m.entry("gopjrt_tuple.hlo.pb", "user+0");
  REQUIRE(::chown((m.backing() / e / "model.hlo_module.pb").c_str(), 4242, 4343) == 0);
  CHECK(reader_process(m.mnt() / e / "model.neff")->wait() == 0);
  CHECK(test::logged_uid(m.compile_log(), 0) == static_cast<long>(find_user("nobody")->uid));
  struct stat st {};
  REQUIRE(::stat((m.backing() / e / "model.neff").c_str(), &st) == 0);
  CHECK(st.st_uid == 4242u);
  CHECK(st.st_gid == 4343u);
  CHECK((st.st_mode & S_IWOTH) == 0);
  CHECK(fs::is_empty(dir / "work"));  // the compile's work folder is gone

  fs::copy_file(k_daemon, bin / "neffcachefs");  // for nobody to run
  auto refused = [&](std::vector<std::string> launcher, const std::string& user) {
    test::TempDir d;
    fs::create_directories(d / "mnt");
    launcher.insert(launcher.end(),
                    {(bin / "neffcachefs").string(), "--compiler-user", user, (d / "b").string(), (d / "mnt").string()});
    return test::run(launcher);
  };
  auto unknown = refused({}, "no-such-user-here");
  CHECK(unknown.exit_code == 1);
  CHECK(unknown.output.find("--compiler-user: unknown user 'no-such-user-here'") != std::string::npos);
  auto not_root = refused({"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"}, "nobody");
  CHECK(not_root.exit_code == 1);
  CHECK(not_root.output.find("--compiler-user needs the daemon to run as root") != std::string::npos);
}

TEST_CASE("a root daemon gives what it creates for a caller to the caller, and the NEFF of their HLO", "[fuse]") {
  REQUIRE(::geteuid() == 0);
  Mount m({}, {"-o", "allow_other"});
  fs::permissions(m.compile_log().parent_path(), fs::perms(0755));  // for nobody to reach the mount
  fs::create_directories(m.backing() / "neuronxcc-2.21.0");
  fs::permissions(m.backing() / "neuronxcc-2.21.0", fs::perms(0777));
  test::TempDir src;
  fs::permissions(src.path(), fs::perms(0755));
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", src / "graph.pb");
  const std::string e = "neuronxcc-2.21.0/MODULE_theirs+0";
  // As a training process of that user writes its graph: a folder, then the HLO.
  auto wrote = test::run({"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", "sh", "-c",
                          "mkdir \"$1\" && cp \"$2\" \"$1/model.hlo_module.pb\"", "sh", (m.mnt() / e).string(),
                          (src / "graph.pb").string()});
  REQUIRE(wrote.exit_code == 0);
  CHECK(reader_process(m.mnt() / e / "model.neff")->wait() == 0);
  const auto nobody = find_user("nobody").value();
  for (const char* name : {"", "model.hlo_module.pb", "model.neff", "model.done"}) {
    INFO(name);
    struct stat st {};
    REQUIRE(::lstat((m.backing() / e / name).c_str(), &st) == 0);
    CHECK(st.st_uid == nobody.uid);
    CHECK(st.st_gid == nobody.gid);
  }
}

// Runs `calls` in a child process as `uid`:`gid` (no other groups) with umask `mask`;
// returns what `calls` returned (0: everything went as expected), 100 if the identity
// could not be taken.
int as_caller(uid_t uid, gid_t gid, mode_t mask, const std::function<int()>& calls) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(100);
    ::umask(mask);
    ::_exit(calls());
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The test's umask for its scope (a daemon started in it inherits it).
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

struct stat lstat_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st;
}

TEST_CASE("what a caller creates through the mount gets the mode and owner the same call gives on a local disk", "[fuse]") {
  REQUIRE(::geteuid() == 0);
  ScopedUmask daemon_umask(022);
  Mount m({}, {"-o", "allow_other"});
  fs::permissions(m.compile_log().parent_path(), fs::perms(0755));  // for nobody to reach the mount
  test::TempDir local;
  fs::permissions(local.path(), fs::perms(0755));
  const auto nobody = find_user("nobody").value();
  const gid_t team = 100;  // "users", a group nobody is not in
  struct Caller {
    std::string name;
    uid_t uid;
    gid_t gid;
    mode_t umask;
  };
  const std::vector<Caller> callers = {
      {"root-000", 0, 0, 0}, {"root-022", 0, 0, 022}, {"nobody-000", nobody.uid, nobody.gid, 0},
      {"nobody-002", nobody.uid, nobody.gid, 002}, {"nobody-077", nobody.uid, nobody.gid, 077}};
  // Every kind of thing a client creates, by the same calls, in a plain folder and in a
  // team's set-group-ID folder (the usual way a team shares one cache).
  auto make = [&](const fs::path& top) {
    fs::create_directory(top / "plain");
    fs::create_directory(top / "team");
    REQUIRE(::chmod((top / "plain").c_str(), 0777) == 0);
    REQUIRE(::chown((top / "team").c_str(), 0, team) == 0);
    REQUIRE(::chmod((top / "team").c_str(), 02777) == 0);
    for (const auto& c : callers) {
      for (const char* folder : {"plain", "team"}) {
        const fs::path d = top / folder / c.name;
        INFO(d);
        CHECK(as_caller(c.uid, c.gid, c.umask, [&] {
                if (::mkdir(d.c_str(), 0777) != 0) return 1;
                for (auto [name, mode] : {std::pair{"f620", 0620}, {"f642", 0642}, {"f777", 0777}, {"suid", 04755},
                                          {"sgid", 02775}}) {
                  int fd = ::open((d / name).c_str(), O_CREAT | O_EXCL | O_WRONLY, mode);
                  if (fd < 0) return 2;
                  ::close(fd);
                }
                // A lock file: a lock created through the mount lives as long as its
                // creator, so it is looked at here.
                int lock = ::open((d / "model.hlo_module.pb.lock").c_str(), O_CREAT | O_EXCL | O_RDWR, 0666);
                struct stat st {};
                if (lock < 0 || ::fstat(lock, &st) != 0 || (st.st_mode & 07777) != (0666 & ~c.umask)) return 3;
                ::close(lock);
                if (::mkdir((d / "sub").c_str(), 0775) != 0 || ::mkdir((d / "sticky").c_str(), 01777) != 0) return 4;
                if (::mkfifo((d / "fifo").c_str(), 0646) != 0) return 5;
                if (::mknod((d / "socket").c_str(), S_IFSOCK | 0757, 0) != 0) return 6;
                if (::link((d / "f642").c_str(), (d / "hard").c_str()) != 0) return 7;
                if (::symlink("f642", (d / "soft").c_str()) != 0) return 8;
                return 0;
              }) == 0);
      }
    }
  };
  make(m.mnt());
  make(local.path());

  std::size_t compared = 0;
  for (const auto& it : fs::recursive_directory_iterator(local.path())) {
    const fs::path rel = it.path().lexically_relative(local.path());
    if (rel.filename() == "model.hlo_module.pb.lock") continue;  // gone with its creator
    INFO(rel);
    const struct stat want = lstat_of(it.path());
    for (const fs::path& got_path : {m.mnt() / rel, m.backing() / rel}) {
      INFO(got_path);
      const struct stat got = lstat_of(got_path);
      CHECK(fmt::format("{:o}", got.st_mode) == fmt::format("{:o}", want.st_mode));
      CHECK(got.st_uid == want.st_uid);
      CHECK(got.st_gid == want.st_gid);
      ++compared;
    }
  }
  CHECK(compared == 2 * (2 + 2 * 5 * 12));  // both folders; 12 names of each caller in each
  // The cases the issue names, spelled out.
  CHECK((lstat_of(m.backing() / "plain/root-000").st_mode & 07777) == 0777);
  CHECK((lstat_of(m.backing() / "plain/root-000/f620").st_mode & 07777) == 0620);
  CHECK((lstat_of(m.backing() / "plain/root-000/f642").st_mode & 07777) == 0642);
  CHECK((lstat_of(m.backing() / "team/nobody-002").st_mode & 07777) == 02775);
  CHECK(lstat_of(m.backing() / "team/nobody-002").st_gid == team);
  CHECK((lstat_of(m.backing() / "team/nobody-002/f777").st_mode & 07777) == 0775);
  CHECK((lstat_of(m.backing() / "plain/nobody-000/suid").st_mode & 07777) == 04755);
  CHECK((lstat_of(m.backing() / "team/nobody-000/sgid").st_mode & 07777) == 0775);  // not in the group

  // What a compile writes keeps its documented modes: a NEFF 0666 less the daemon's
  // umask, never writable by others; model.done and the metadata 0644.
  const fs::path e = m.mnt() / m.entry("gopjrt_tuple.hlo.pb", "modes+0");
  REQUIRE(reader_process(e / "model.neff")->wait() == 0);
  CHECK((lstat_of(e / "model.neff").st_mode & 07777) == 0644);
  CHECK((lstat_of(e / "model.done").st_mode & 07777) == 0644);
  CHECK((lstat_of(e / k_meta_file).st_mode & 07777) == 0644);
}

TEST_CASE("a write by a user who is not the owner clears set-user-ID and set-group-ID bits, as on a local disk", "[fuse]") {
  REQUIRE(::geteuid() == 0);
  Mount m({}, {"-o", "allow_other"});
  fs::permissions(m.compile_log().parent_path(), fs::perms(0755));  // for nobody to reach the mount
  test::TempDir local;
  fs::permissions(local.path(), fs::perms(0755));
  const auto nobody = find_user("nobody").value();
  for (const fs::path& top : {m.mnt(), local.path()}) {
    for (mode_t mode : {04777, 02777, 06777}) {
      for (int how : {0, O_TRUNC, O_APPEND}) {
        const fs::path f = top / fmt::format("f{:o}-{}", mode, how);
        INFO(f);
        write_plain(f, "root's");
        REQUIRE(::chmod(f.c_str(), mode) == 0);
        REQUIRE((lstat_of(f).st_mode & 07777) == mode);
        CHECK(as_caller(nobody.uid, nobody.gid, 022, [&] {
                int fd = ::open(f.c_str(), O_WRONLY | how);
                if (fd < 0) return 1;
                bool wrote = ::write(fd, "x", 1) == 1;
                ::close(fd);
                return wrote ? 0 : 2;
              }) == 0);
        CHECK((lstat_of(f).st_mode & 07777) == 0777);
        if (top == m.mnt()) CHECK((lstat_of(m.backing() / f.filename()).st_mode & 07777) == 0777);
      }
    }
  }
  // Root's write keeps them, as on a local disk.
  const fs::path f = m.mnt() / "root-writes";
  write_plain(f, "x");
  REQUIRE(::chmod(f.c_str(), 06777) == 0);
  write_plain(f, "y");
  CHECK((lstat_of(f).st_mode & 07777) == 06777);
}

TEST_CASE("device nodes are refused through the mount with EPERM; FIFOs and sockets are made", "[fuse]") {
  Mount m;
  CHECK(::mknod((m.mnt() / "chr").c_str(), S_IFCHR | 0666, makedev(1, 3)) == -1);
  CHECK(errno == EPERM);
  CHECK(::mknod((m.mnt() / "blk").c_str(), S_IFBLK | 0600, makedev(7, 0)) == -1);
  CHECK(errno == EPERM);
  struct stat st {};
  CHECK(::lstat((m.backing() / "chr").c_str(), &st) == -1);
  CHECK(::lstat((m.backing() / "blk").c_str(), &st) == -1);
  REQUIRE(::mkfifo((m.mnt() / "fifo").c_str(), 0600) == 0);
  CHECK(S_ISFIFO(lstat_of(m.backing() / "fifo").st_mode));
  REQUIRE(::mknod((m.mnt() / "socket").c_str(), S_IFSOCK | 0600, 0) == 0);
  CHECK(S_ISSOCK(lstat_of(m.backing() / "socket").st_mode));
}

TEST_CASE("a user who may write both folders renames a folder between them, reachable at once under its new name", "[fuse]") {
  REQUIRE(::geteuid() == 0);
  Mount m({}, {"-o", "allow_other"});
  fs::permissions(m.compile_log().parent_path(), fs::perms(0755));  // for nobody to reach the mount
  const auto nobody = find_user("nobody").value();
  // Folders open to everyone, made as a script under umask 0 makes them.
  {
    ScopedUmask none(0);
    REQUIRE(::mkdir((m.mnt() / "from").c_str(), 0777) == 0);
    REQUIRE(::mkdir((m.mnt() / "to").c_str(), 0777) == 0);
  }
  const fs::path from = m.mnt() / "from" / "d", to = m.mnt() / "to" / "e";
  CHECK(as_caller(nobody.uid, nobody.gid, 022, [&] {
          if (::mkdir(from.c_str(), 0755) != 0) return 1;
          int fd = ::open((from / "x").c_str(), O_CREAT | O_WRONLY, 0644);
          if (fd < 0) return 2;
          ::close(fd);
          for (int round = 0; round < 3; ++round) {
            if (::rename(from.c_str(), to.c_str()) != 0) return 10 + round;
            struct stat st {};
            if (::stat((to / "x").c_str(), &st) != 0 || ::stat(from.c_str(), &st) == 0) return 20 + round;
            if (::rename(to.c_str(), from.c_str()) != 0) return 30 + round;
            if (::stat((from / "x").c_str(), &st) != 0 || ::stat(to.c_str(), &st) == 0) return 40 + round;
          }
          return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : 50;
        }) == 0);
  CHECK(fs::exists(m.mnt() / "to/e/x"));
  CHECK(fs::exists(m.backing() / "to/e/x"));
  CHECK_FALSE(fs::exists(m.backing() / "from/d"));
}

TEST_CASE("nothing outside the backing directory is reached through the mount", "[fuse]") {
  Mount m;
  test::TempDir outside;
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", outside / "model.hlo_module.pb");
  const fs::path top = m.backing() / "neuronxcc-2.21.0";
  fs::create_directories(top);
  fs::create_directory_symlink(outside.path(), top / "MODULE_abs+0");            // absolute
  fs::create_directory_symlink("../../../" + outside.path().filename().string(), top / "MODULE_rel+0");  // climbing
  fs::create_symlink("/etc/passwd", top / "passwd");
  for (const char* name : {"MODULE_abs+0", "MODULE_rel+0", "passwd"}) {
    INFO(name);
    struct stat st {};
    REQUIRE(::lstat((m.mnt() / "neuronxcc-2.21.0" / name).c_str(), &st) == 0);
    CHECK(S_ISLNK(st.st_mode));  // shown as the link it is, never followed by the daemon
  }
  // Opening through an entry folder that is a link: the kernel follows it outside the
  // mount, so the daemon is never asked and nothing is compiled or written there.
  CHECK(read_all(m.mnt() / "neuronxcc-2.21.0/MODULE_abs+0/model.neff").first == ENOENT);
  CHECK(read_all(m.mnt() / "neuronxcc-2.21.0/MODULE_rel+0/model.neff").first == ENOENT);
  CHECK(m.compiles() == 0);
  // Nor does a batch compile of the backing directory follow it.
  auto r = test::run({NEFFCACHE_TOOL, "compile", "--cache", m.backing().string(), "--compiler",
                      k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}"});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(outside / "model.neff"));
  CHECK_FALSE(fs::exists(outside / "model.log"));
  // Renames out of the mount cross a file system: refused.
  write_plain(m.mnt() / "leaving", "x");
  CHECK(::rename((m.mnt() / "leaving").c_str(), (outside / "left").c_str()) != 0);
  CHECK(errno == EXDEV);
  CHECK(fs::exists(m.backing() / "leaving"));
}

TEST_CASE("a kernel request timeout shorter than a compile is warned about at start", "[fuse]") {
  const std::string knob = "/proc/sys/fs/fuse/default_request_timeout";
  auto old = neffcache::detail::read_file(knob);
  if (!old || ::access(knob.c_str(), W_OK) != 0) SKIP("this kernel has no FUSE request timeout to set");
  // Large values, so that mounts made meanwhile by other tests are not affected.
  write_plain(knob, "60000");
  struct Restore {
    std::string knob, value;
    ~Restore() { std::ofstream(knob) << value; }
  } restore{knob, *old};
  test::TempDir dir;
  fs::create_directories(dir / "backing");
  fs::create_directories(dir / "mnt");
  // An unknown FUSE option stops the daemon after its checks, before it mounts.
  auto start = [&](const std::string& compile_timeout, std::vector<std::string> more = {}) {
    std::vector<std::string> argv{k_daemon, "--foreground", "--compiler", k_fake + " {hlo} --output {neff}",
                                  "--compile-timeout", compile_timeout, "-o", "no_such_option"};
    argv.insert(argv.end(), more.begin(), more.end());
    argv.push_back((dir / "backing").string());
    argv.push_back((dir / "mnt").string());
    return test::run(argv).output;
  };
  auto out = start("64000");
  CHECK(out.find("warning: " + knob + " is 60000 s, shorter than --compile-timeout 64000 s") != std::string::npos);
  CHECK(start("3600").find("warning") == std::string::npos);
  // A wait deadline below the kernel's bound makes the long compile timeout harmless.
  CHECK(start("64000", {"--wait-timeout", "600"}).find("warning") == std::string::npos);
  CHECK(start("64000", {"--wait-timeout", "62000"}).find("shorter than --wait-timeout 62000 s") != std::string::npos);
}

TEST_CASE("neffcache compile on a mount asks the daemon", "[fuse]") {
  Mount m;
  auto a = m.entry("gopjrt_tuple.hlo.pb", "ask+0");
  auto b = m.entry("rocm08_normal_9.hlo_proto.pb", "ask+1");
  // Through the mount a pending entry lists model.neff; the tools read the true state.
  auto scan = test::run({test::k_tool, "scan", "--cache", m.mnt().string(), "--json"});
  REQUIRE(scan.exit_code == 0);
  CHECK(nlohmann::json::parse(scan.output)["remaining"] == 2);
  // The tool's own compiler does not exist: every compile must be the daemon's.
  auto r = test::run({test::k_tool, "compile", "--cache", m.mnt().string(), "--compiler", "no-such-cc {hlo} {neff}", "--json"});
  CHECK(r.exit_code == 0);
  auto report = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  CHECK(report["compilation_summary"]["true"] == 2);
  CHECK(report["compilation_report"].contains((m.mnt() / a / "model.hlo_module.pb").string()));
  CHECK(m.compiles() == 2);
  CHECK(fs::exists(m.backing() / a / "model.done"));
  CHECK(fs::exists(m.backing() / b / "model.done"));
  // stats shows the daemon's counters beside the cache's own figures.
  auto stats = nlohmann::json::parse(test::run({test::k_tool, "stats", "--cache", m.mnt().string(), "--json"}).output);
  CHECK(stats["states"]["done"] == 2);
  CHECK(stats["daemon"]["compiles"]["started"] == 2);
  // clear-neffs through the mount: the mount stops serving the old NEFF at once.
  CHECK(test::run({test::k_tool, "clear-neffs", "--cache", m.mnt().string()}).exit_code == 0);
  CHECK_FALSE(fs::exists(m.backing() / a / "model.neff"));
  struct stat st {};
  REQUIRE(::stat((m.mnt() / a / "model.neff").c_str(), &st) == 0);
  CHECK(st.st_size == 0);  // a placeholder again: opening it compiles anew
}

TEST_CASE("neuron_parallel_compile on a mount: the daemon compiles as graphs are written", "[fuse]") {
  Mount m;
  test::TempDir dir;
  std::string body = "#!/bin/sh\n";
  for (const auto& f : {"gopjrt_tuple.hlo.pb", "rocm08_normal_9.hlo_proto.pb"})
    body += fmt::format(
        "p=$('{}' put --compiler-version 2.21.0 '{}') || exit 9\n"
        "echo \"INFO ||NEURON_CC_WRAPPER||: Extracting graphs ($p/model.hlo_module.pb) for ahead-of-time parallel "
        "compilation. No compilation was done.\"\n",
        test::k_tool, (test::k_corpus / f).string());
  test::spit(dir / "train.sh", body);
  fs::permissions(dir / "train.sh", fs::perms::owner_all);
  // The tool's own compiler does not exist: every compile must be the daemon's.
  auto r = test::run({"env", "-C", dir.path().string(), "-u", "NEURON_CC_FLAGS",
                      "NEURON_COMPILE_CACHE_URL=" + m.mnt().string(), NEFFCACHE_NPC, "--compiler",
                      "no-such-cc {hlo} {neff}", (dir / "train.sh").string()});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("INFO ||NEURON_PARALLEL_COMPILE||: Total successful compilations: 2") != std::string::npos);
  CHECK(m.compiles() == 2);
}

TEST_CASE("a lock file created through the mount is owned by its creator, stale at once when it dies", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_tuple.hlo.pb", "lock+0");
  auto lock_in_mount = m.mnt() / e / "model.hlo_module.pb.lock";
  auto lock_in_backing = m.backing() / e / "model.hlo_module.pb.lock";
  // What an unmodified Neuron client does: create the lock in its own process, compile.
  test::Child client({"sh", "-c", fmt::format("exec 3>'{}'; echo created; exec sleep 60", lock_in_mount.string())});
  REQUIRE(client.line() == "created");
  auto info = inspect_lock(lock_in_backing.string());
  REQUIRE(info.has_value());
  CHECK(info->state == LockState::live);
  CHECK(info->kernel_locked);  // held for the client: tools and other daemons keep off
  CompileSettings tool;
  tool.compiler = CompilerTemplate::parse(k_fake + " {hlo} --output {neff}").value();
  CHECK(compile_entry((m.backing() / e).string(), tool).outcome == CompileOutcome::busy);

  client.kill(SIGKILL);
  client.wait();
  for (int i = 0; i < 100 && fs::exists(lock_in_backing); ++i) std::this_thread::sleep_for(10ms);
  CHECK_FALSE(fs::exists(lock_in_backing));  // gone within a second
  CHECK(read_all(m.mnt() / e / "model.neff").first == 0);
}

TEST_CASE("an entry's lock whose owner is gone is removed when the entry is looked up; a live one stays", "[fuse]") {
  test::TempDir shared;
  std::string dead, live;
  {
    Mount m({}, {}, shared.path());
    dead = m.entry("gopjrt_tuple.hlo.pb", "deadlock+0");
    live = m.entry("gopjrt_x_squared.hlo.pb", "livelock+0");
    REQUIRE(read_all(m.mnt() / dead / "model.neff").first == 0);
    REQUIRE(read_all(m.mnt() / live / "model.neff").first == 0);
  }
  // What a publisher killed between model.done and its unlock leaves: a lock whose owner,
  // a process of this machine, is gone.
  test::Child gone({"true"});
  auto owner = detail::current_process();
  owner.pid = gone.pid();
  gone.wait();
  test::spit(shared / dead / "model.hlo_module.pb.lock", detail::lock_record(LockOwner{owner, "0123456789abcdef"}));
  auto held = EntryLock::try_acquire((shared / live / "model.hlo_module.pb.lock").string());
  REQUIRE(held.has_value());

  Mount m({}, {}, shared.path());
  struct stat st {};
  REQUIRE(::stat((m.mnt() / dead).c_str(), &st) == 0);
  REQUIRE(::stat((m.mnt() / live).c_str(), &st) == 0);
  CHECK_FALSE(fs::exists(shared / dead / "model.hlo_module.pb.lock"));
  CHECK(fs::exists(shared / live / "model.hlo_module.pb.lock"));
  CHECK(read_all(m.mnt() / dead / "model.neff").first == 0);
  CHECK(m.compiles() == 0);
}

TEST_CASE("a client that removes its own lock file leaves nothing tracked", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_tuple.hlo.pb", "lock2+0");
  auto lock = m.mnt() / e / "model.hlo_module.pb.lock";
  test::Child client({"sh", "-c", fmt::format("exec 3>'{}'; rm '{}'; echo done; exec sleep 60", lock.string(), lock.string())});
  REQUIRE(client.line() == "done");
  CHECK_FALSE(fs::exists(m.backing() / e / "model.hlo_module.pb.lock"));
  // A new lock by someone else at the same name is not touched when the first client dies.
  auto held = EntryLock::try_acquire((m.backing() / e / "model.hlo_module.pb.lock").string());
  REQUIRE(held.has_value());
  client.kill(SIGKILL);
  client.wait();
  std::this_thread::sleep_for(200ms);
  CHECK(fs::exists(m.backing() / e / "model.hlo_module.pb.lock"));
}

TEST_CASE("locks through the mount and on the backing file see each other", "[fuse]") {
  Mount m;
  test::spit(m.backing() / "shared.dat", "data");
  auto through = m.mnt() / "shared.dat";
  auto direct = m.backing() / "shared.dat";

  // A POSIX lock taken by a client through the mount blocks a tool on the backing file.
  int client = ::open(through.c_str(), O_RDWR);
  REQUIRE(client >= 0);
  struct flock wr {};
  wr.l_type = F_WRLCK;
  wr.l_whence = SEEK_SET;
  REQUIRE(::fcntl(client, F_SETLK, &wr) == 0);
  int tool = ::open(direct.c_str(), O_RDWR);
  REQUIRE(tool >= 0);
  struct flock probe = wr;
  probe.l_pid = 0;
  REQUIRE(::fcntl(tool, F_OFD_GETLK, &probe) == 0);
  CHECK(probe.l_type == F_WRLCK);  // the tool sees the client's lock
  struct flock ofd = wr;
  ofd.l_pid = 0;
  CHECK(::fcntl(tool, F_OFD_SETLK, &ofd) != 0);
  ::close(client);  // closing releases it
  CHECK(::fcntl(tool, F_OFD_SETLK, &ofd) == 0);
  // ...and the tool's lock now blocks a client.
  client = ::open(through.c_str(), O_RDWR);
  CHECK(::fcntl(client, F_SETLK, &wr) != 0);
  CHECK((errno == EAGAIN || errno == EACCES));
  ::close(client);
  ::close(tool);

  // flock, both ways.
  tool = ::open(direct.c_str(), O_RDONLY);
  REQUIRE(::flock(tool, LOCK_EX | LOCK_NB) == 0);
  client = ::open(through.c_str(), O_RDONLY);
  CHECK(::flock(client, LOCK_EX | LOCK_NB) != 0);
  CHECK(errno == EWOULDBLOCK);
  // A blocking flock through the mount waits (on no daemon worker) until the tool lets go.
  test::Child waiter({"flock", through.string(), "-c", "echo got"});
  std::this_thread::sleep_for(200ms);
  ::flock(tool, LOCK_UN);
  CHECK(waiter.line() == "got");
  CHECK(waiter.wait() == 0);
  ::close(client);
  ::close(tool);
}

namespace {

// Peak resident memory (VmHWM) of a process, in KiB.
long peak_rss_kib(pid_t pid) {
  std::istringstream status(test::slurp(fmt::format("/proc/{}/status", pid)));
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return std::stol(line.substr(6));
  return -1;
}

long open_fds(pid_t pid) {
  long n = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(fmt::format("/proc/{}/fd", pid))) ++n;
  return n;
}

// Files a process holds open for reading or writing whose path ends with `suffix`
// (O_PATH descriptors, which only name a file, are left out).
long open_files(pid_t pid, std::string_view suffix) {
  long n = 0;
  for (const auto& f : fs::directory_iterator(fmt::format("/proc/{}/fd", pid))) {
    std::error_code ec;
    if (!fs::read_symlink(f.path(), ec).string().ends_with(suffix)) continue;
    std::istringstream info(test::slurp(fmt::format("/proc/{}/fdinfo/{}", pid, f.path().filename().string())));
    for (std::string key, value; info >> key >> value;)
      if (key == "flags:") n += (std::stoul(value, nullptr, 8) & O_PATH) == 0;
  }
  return n;
}

}  // namespace

TEST_CASE("1000 readers on 200 pending entries with -j 2: all whole, answered at the publish; the mount stays responsive", "[fuse][load]") {
  struct rlimit nofile {};  // a pipe to each reader
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &nofile) == 0);
  nofile.rlim_cur = nofile.rlim_max;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &nofile) == 0);
  Mount m({"NEFFCACHE_FAKE_SECONDS=0.02"});
  const auto corpus = test::corpus_files();
  std::vector<std::string> entries;
  for (int i = 0; i < 200; ++i) {
    entries.push_back(m.entry(corpus[static_cast<std::size_t>(i) % corpus.size()].filename().string(),
                              fmt::format("load{}+0", i)));
    // A flag of its own per entry, so that no two are canonically equal (no dedup here).
    REQUIRE(write_compile_flags((m.backing() / entries.back() / "compile_flags.json").string(),
                                {fmt::format("--internal-entry={}", i)}).has_value());
  }
  // A finished entry to read while the others compile.
  auto hit = m.entry("gopjrt_tuple.hlo.pb", "hit+0");
  REQUIRE(read_all(m.mnt() / hit / "model.neff").first == 0);
  const int before = m.compiles();
  const pid_t daemon = m.daemon().pid();
  long fds_before = open_fds(daemon), worst_fds = fds_before;
  std::vector<std::unique_ptr<test::Child>> readers;
  for (int r = 0; r < 1000; ++r) readers.push_back(reader_process(m.mnt() / entries[static_cast<std::size_t>(r % 200)] / "model.neff"));
  // Meanwhile: listings, stats and hits on the same mount, each timed.
  std::chrono::duration<double, std::milli> worst_ls{0}, worst_stat{0}, worst_hit{0};
  int rounds = 0;
  auto time = [](auto&& f) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
  };
  const auto give_up = std::chrono::steady_clock::now() + 180s;
  while (m.compiles() - before < 200 && std::chrono::steady_clock::now() < give_up) {
    ++rounds;
    worst_ls = std::max(worst_ls, time([&] {
      std::size_t n = 0;
      for ([[maybe_unused]] const auto& d : fs::directory_iterator(m.mnt() / "neuronxcc-2.21.0")) ++n;
      CHECK(n == 201);
    }));
    worst_stat = std::max(worst_stat, time([&] {
      struct stat st {};
      CHECK(::stat((m.mnt() / hit / "model.neff").c_str(), &st) == 0);
    }));
    worst_hit = std::max(worst_hit, time([&] { CHECK(read_all(m.mnt() / hit / "model.neff").first == 0); }));
    worst_fds = std::max(worst_fds, open_fds(daemon));
  }
  // Every reader got a whole NEFF. How long after its entry's publish (model.done), or
  // after its own open if that came later, was it answered?
  double worst_after_publish_ms = 0;
  for (std::size_t r = 0; r < readers.size(); ++r) {
    const std::string start = readers[r]->line(), opened = readers[r]->line();
    REQUIRE(readers[r]->wait() == 0);
    REQUIRE((start.starts_with("start ") && opened.starts_with("opened ")));
    struct stat done {};
    REQUIRE(::stat((m.backing() / entries[r % 200] / "model.done").c_str(), &done) == 0);
    const double published = static_cast<double>(done.st_mtim.tv_sec) * 1e9 + static_cast<double>(done.st_mtim.tv_nsec);
    const double asked = std::max(published, std::stod(start.substr(6)));
    worst_after_publish_ms = std::max(worst_after_publish_ms, (std::stod(opened.substr(7)) - asked) / 1e6);
  }
  CHECK(m.compiles() - before == 200);
  // Every open file is let go once its reader is gone (releases come a moment later).
  for (int i = 0; i < 100 && open_files(daemon, "/model.neff") > 0; ++i) std::this_thread::sleep_for(10ms);
  CHECK(open_files(daemon, "/model.neff") == 0);
  // Reported, not asserted: timing goals belong to the benchmarks.
  WARN(fmt::format("1000 readers on 200 compiles (-j 2): worst answer {:.1f} ms after the publish; daemon peak "
                   "{:.1f} MiB resident, {} descriptors ({} before); worst latency meanwhile: ls {:.1f} ms, "
                   "stat {:.1f} ms, hit open+read {:.1f} ms over {} rounds",
                   worst_after_publish_ms, static_cast<double>(peak_rss_kib(daemon)) / 1024, worst_fds, fds_before,
                   worst_ls.count(), worst_stat.count(), worst_hit.count(), rounds));
}

TEST_CASE("a burst of 10000 entries written through the mount: every file whole, the mount responsive, a clean stop", "[fuse][load]") {
  // As graph extraction writes them: a folder, compile_flags.json, then the HLO, whose
  // close starts an eager compile. Flags differ per entry, so no two are equal.
  Mount m({"NEFFCACHE_FAKE_SECONDS=0.05"});
  const std::string hlo = test::slurp(test::k_corpus / "gopjrt_x_squared.hlo.pb");
  auto hit = m.entry("gopjrt_tuple.hlo.pb", "hit+0");
  REQUIRE(read_all(m.mnt() / hit / "model.neff").first == 0);
  const pid_t daemon = m.daemon().pid();
  const long fds_before = open_fds(daemon);
  constexpr int k_entries = 10000;
  auto name = [](int i) { return fmt::format("neuronxcc-2.21.0/MODULE_burst{}+0", i); };
  auto flags = [](int i) { return fmt::format("[\"--internal-entry={}\"]", i); };
  // The same burst on the backing disk directly, for comparison.
  test::TempDir native;
  const auto native_start = std::chrono::steady_clock::now();
  for (int i = 0; i < k_entries; ++i) {
    const fs::path dir = native / name(i);
    fs::create_directories(dir);
    write_plain(dir / "compile_flags.json", flags(i));
    write_plain(dir / "model.hlo_module.pb", hlo);
  }
  const double native_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - native_start).count();
  std::chrono::duration<double, std::milli> worst_hit{0};
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < k_entries; ++i) {
    const fs::path dir = m.mnt() / name(i);
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    write_plain(dir / "compile_flags.json", flags(i));
    write_plain(dir / "model.hlo_module.pb", hlo);
    if (i % 500 == 0) {  // a training process reading a finished NEFF meanwhile
      auto t0 = std::chrono::steady_clock::now();
      CHECK(read_all(m.mnt() / hit / "model.neff").first == 0);
      worst_hit = std::max(worst_hit, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0));
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const long fds_after = open_fds(daemon), rss_kib = peak_rss_kib(daemon);
  const int compiled = m.compiles();
  // Stopped with thousands of compiles queued: it goes at once and records nothing.
  const auto stop = std::chrono::steady_clock::now();
  CHECK(m.stop(SIGTERM) == 0);
  const double stop_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stop).count();
  CHECK(stop_seconds < 30);
  int published = 0;
  for (int i = 0; i < k_entries; ++i) {
    INFO(name(i));
    const fs::path dir = m.backing() / name(i);
    REQUIRE(test::slurp(dir / "model.hlo_module.pb") == hlo);
    REQUIRE(test::slurp(dir / "compile_flags.json") == flags(i));
    CHECK_FALSE(fs::exists(dir / "model.log"));
    CHECK_FALSE(fs::exists(dir / "model.hlo_module.pb.lock"));
    if (fs::exists(dir / "model.neff")) {
      ++published;
      CHECK(fs::exists(dir / "model.done"));
      CHECK(fake::parse_fake_neff(test::slurp(dir / "model.neff")).has_value());
    }
  }
  CHECK(published <= compiled);
  WARN(fmt::format("burst of {} entries through the mount: {:.1f} s ({:.0f} entries/s; {:.1f} times the {:.2f} s "
                   "on the disk directly) while {} compiles ran; "
                   "worst open+read of a finished NEFF meanwhile {:.1f} ms; daemon peak {:.1f} MiB resident, "
                   "{} descriptors ({} before); stopped in {:.2f} s with the rest queued",
                   k_entries, seconds, k_entries / seconds, seconds / native_seconds, native_seconds, compiled,
                   worst_hit.count(),
                   static_cast<double>(rss_kib) / 1024, fds_after, fds_before, stop_seconds));
}

namespace {

// The neuron-client-sim command line over the corpus graphs `graphs`.
std::vector<std::string> client_sim_command(const std::vector<std::string>& graphs) {
  std::vector<std::string> argv{NEFFCACHE_CLIENT_SIM, "--json", "--poll", "0.02", "--extract-interval", "0.05",
                                "--compiler", k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}"};
  for (const auto& g : graphs) argv.push_back((test::k_corpus / g).string());
  return argv;
}

// neuron-client-sim with the cache at `cache` and the fake compiler logging to `log`;
// `env` adds NAME=value words (NEURON_EXTRACT_GRAPHS_ONLY=1 for extraction).
std::vector<std::string> client_sim(const fs::path& cache, const fs::path& log, std::vector<std::string> env,
                                    const std::vector<std::string>& graphs) {
  std::vector<std::string> argv{"env", "-u", "NEURON_CC_FLAGS", "-u", "NEURON_EXTRACT_GRAPHS_ONLY",
                                "NEURON_COMPILE_CACHE_URL=" + cache.string(), "NEFFCACHE_FAKE_RATE=0",
                                "NEFFCACHE_FAKE_LOG=" + log.string()};
  argv.insert(argv.end(), env.begin(), env.end());
  auto command = client_sim_command(graphs);
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

nlohmann::json sim_summary(const std::string& output) {
  auto begin = output.find("{\n");
  REQUIRE(begin != std::string::npos);
  return nlohmann::json::parse(output.substr(begin));
}

}  // namespace

TEST_CASE("client simulator through the mount: extraction, then training that only waits for the daemon", "[fuse]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=0.3"});
  test::TempDir dir;
  const std::vector<std::string> graphs{"spu_tf_jit_comp.hlo.pb", "rocm08_normal_9.hlo_proto.pb", "gopjrt_tuple.hlo.pb"};
  auto extract = test::run(client_sim(m.mnt(), dir / "client.log", {"NEURON_EXTRACT_GRAPHS_ONLY=1"}, graphs));
  REQUIRE(extract.exit_code == 0);
  CHECK(sim_summary(extract.output)["extracted"] == 3);
  // Training right away: the eager compiles are running; every open waits on the daemon.
  auto train = test::run(client_sim(m.mnt(), dir / "client.log", {}, graphs));
  REQUIRE(train.exit_code == 0);
  auto s = sim_summary(train.output);
  CHECK(s["hits"] == 3);
  CHECK(s["compiled"] == 0);
  CHECK(s["cache_seconds"].get<double>() > 0.1);  // it did wait for compiles
  CHECK(m.compiles() == 3);
  CHECK_FALSE(fs::exists(dir / "client.log"));  // the client ran no compiler
}

TEST_CASE("client simulator through the mount on a cold cache: clients compile, the daemon keeps off", "[fuse]") {
  Mount m;
  test::TempDir dir;
  const std::vector<std::string> graphs{"spu_tf_jit_comp.hlo.pb", "rocm08_normal_9.hlo_proto.pb"};
  // Two clients race as two ranks of one job would: each entry is new, so a client takes
  // the existence lock, writes the HLO and creates model.neff itself through the mount.
  const auto log = dir / "client.log";
  test::Child a(client_sim(m.mnt(), log, {"NEFFCACHE_FAKE_SECONDS=0.3"}, graphs));
  test::Child b(client_sim(m.mnt(), log, {"NEFFCACHE_FAKE_SECONDS=0.3"}, graphs));
  auto sa = sim_summary(a.rest()), sb = sim_summary(b.rest());
  CHECK(a.wait() == 0);
  CHECK(b.wait() == 0);
  CHECK(sa["compiled"].get<int>() + sb["compiled"].get<int>() == 2);
  CHECK(sa["failed"] == 0);
  CHECK(sb["failed"] == 0);
  CHECK(test::count_lines(log) == 2);
  CHECK(m.compiles() == 0);  // the daemon saw the clients' locks and compiled nothing
  for (const auto& g : graphs) {
    auto again = test::run(client_sim(m.mnt(), log, {}, {g}));
    CHECK(sim_summary(again.output)["hits"] == 1);
  }
  CHECK(test::count_lines(log) == 2);
}

TEST_CASE("every neffcache command on a mount", "[fuse]") {
  test::TempDir aux;
  const auto fail_flag = aux / "fail";
  // gopjrt_x_squared (graph hash b1752fb3...) fails while `fail_flag` exists.
  Mount m({"NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_FAIL_WHILE=" + fail_flag.string(), "NEFFCACHE_FAKE_ONLY=MODULE_b1752fb3"});
  const std::string mnt = m.mnt().string();
  auto tool = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{"env", "-u", "NEURON_CC_FLAGS", "-u", "NEURON_COMPILE_CACHE_URL", test::k_tool};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--cache");
    argv.push_back(mnt);
    return test::run(argv);
  };
  auto states = [&] {
    std::map<std::string, int> n;
    for (const auto& e : nlohmann::json::parse(tool({"ls", "--json"}).output)) ++n[e["state"].get<std::string>()];
    return n;
  };
  auto rel = [&](const fs::path& p) { return fs::relative(p, m.mnt()); };

  // put through the mount: each graph written starts its compile (eager).
  test::spit(fail_flag, "");
  std::vector<fs::path> entries;
  for (const auto* g : {"gopjrt_tuple.hlo.pb", "rocm08_normal_9.hlo_proto.pb", "gopjrt_x_squared.hlo.pb"}) {
    auto r = tool({"put", "--compiler-version", "2.21.0", (test::k_corpus / g).string()});
    REQUIRE(r.exit_code == 0);
    entries.emplace_back(r.output.substr(0, r.output.size() - 1));
    CHECK(entries.back().string().rfind(mnt, 0) == 0);
  }
  for (int i = 0; i < 500 && states()["done"] + states()["failed"] < 3; ++i) std::this_thread::sleep_for(20ms);
  CHECK(states() == std::map<std::string, int>{{"done", 2}, {"failed", 1}});
  CHECK(m.compiles() == 3);
  auto scan = nlohmann::json::parse(tool({"scan", "--with-failed", "--json"}).output);
  CHECK(scan["remaining"] == 1);
  CHECK(scan["done"] == 2);

  // analyze reads the graphs; no compile.
  auto an = tool({"analyze", "--output", (aux / "an").string()});
  CHECK(an.exit_code == 0);
  CHECK(nlohmann::json::parse(test::slurp(aux / "an" / "result.json"))["total"]["graphs"] == 3);

  // retry: the failure is cleared and the next open compiles it.
  fs::remove(fail_flag);
  CHECK(read_all(entries[2] / "model.neff").first == EIO);  // still recorded
  auto r = tool({"retry", "--all"});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find(rel(entries[2]).string()) != std::string::npos);
  CHECK(read_all(entries[2] / "model.neff").first == 0);
  CHECK(states()["done"] == 3);

  // verify catches a damaged NEFF in the backing directory; --repair makes it pending,
  // and the mount shows a placeholder again at once.
  CHECK(tool({"verify"}).exit_code == 0);
  const auto damaged = m.backing() / rel(entries[1]) / "model.neff";
  std::string neff = test::slurp(damaged);
  neff[neff.size() / 2] ^= 1;
  {
    std::fstream out(damaged, std::ios::in | std::ios::out | std::ios::binary);
    out.write(neff.data(), static_cast<std::streamsize>(neff.size()));
  }
  CHECK(tool({"verify"}).exit_code == 1);
  CHECK(tool({"verify", "--repair"}).exit_code == 0);
  struct stat st {};
  REQUIRE(::stat((entries[1] / "model.neff").c_str(), &st) == 0);
  CHECK(st.st_size == 0);
  auto [err, bytes] = read_all(entries[1] / "model.neff");
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(bytes).has_value());

  // clear-locks: an hours-old Neuron lock goes; a client's live lock through the mount stays.
  const auto old_lock = m.backing() / rel(entries[0]) / "model.hlo_module.pb.lock";
  test::spit(old_lock, "");
  fs::last_write_time(old_lock, fs::file_time_type::clock::now() - std::chrono::hours(3));
  test::Child client({"sh", "-c", fmt::format("exec 3>'{}'; echo created; exec sleep 60",
                                              (entries[1] / "model.hlo_module.pb.lock").string())});
  REQUIRE(client.line() == "created");
  r = tool({"clear-locks"});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(old_lock));
  CHECK(fs::exists(m.backing() / rel(entries[1]) / "model.hlo_module.pb.lock"));
  CHECK(r.output.find("1 stale lock removed, 1 live lock left alone") != std::string::npos);
  client.kill(SIGKILL);
  client.wait();

  // gc: a dry run removes nothing; a limit of one byte evicts every done entry.
  CHECK(tool({"gc", "--max-size", "1", "--dry-run"}).exit_code == 0);
  CHECK(fs::exists(entries[0] / "model.neff"));
  r = tool({"gc", "--max-size", "1"});
  CHECK(r.exit_code == 0);
  for (const auto& e : entries) CHECK_FALSE(fs::exists(e));
  CHECK(states().empty());

  // clean --yes removes what is left (once the eager compile of the new entry is over:
  // an entry being compiled is spared).
  REQUIRE(tool({"put", "--compiler-version", "2.21.0", (test::k_corpus / "gopjrt_tuple.hlo.pb").string()}).exit_code == 0);
  for (int i = 0; i < 500 && states()["done"] < 1; ++i) std::this_thread::sleep_for(20ms);
  CHECK(tool({"clean", "--yes"}).exit_code == 0);
  CHECK(fs::is_empty(m.backing()));
}

TEST_CASE("every neuron_parallel_compile --command on a mount, with the client simulator as trial run", "[fuse]") {
  Mount m;
  test::TempDir dir;
  const std::vector<std::string> graphs{"spu_tf_jit_comp.hlo.pb", "rocm08_normal_9.hlo_proto.pb"};
  auto npc = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{"env", "-C", dir.path().string(), "-u", "NEURON_CC_FLAGS", "-u",
                                  "NEURON_EXTRACT_GRAPHS_ONLY", "NEURON_COMPILE_CACHE_URL=" + m.mnt().string(),
                                  NEFFCACHE_NPC, "--compiler", "no-such-cc {hlo} {neff}"};
    argv.insert(argv.end(), args.begin(), args.end());
    return test::run(argv);
  };
  auto with_trial = [&](std::vector<std::string> args) {
    auto t = client_sim_command(graphs);
    args.insert(args.end(), t.begin(), t.end());
    return args;
  };
  auto r = npc(with_trial({"--command", "analyze", "--analyze-output", "an"}));
  CHECK(r.exit_code == 0);
  CHECK(nlohmann::json::parse(test::slurp(dir / "an" / "result.json"))["total"]["graphs"] == 2);
  r = npc(with_trial({"--command", "collect"}));
  CHECK(r.exit_code == 0);
  // The daemon compiled the graphs as they were written: compile finds nothing left.
  r = npc({"--command", "compile"});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("Total failed compilations: 0") != std::string::npos);
  CHECK(m.compiles() == 2);
  CHECK(npc({"--command", "scan"}).output.find("done are 2, total is 2") != std::string::npos);
  CHECK(npc({"--command", "clear-neffs"}).exit_code == 0);
  CHECK(npc({"--command", "scan-with-failed"}).output.find("remaining items are 2") != std::string::npos);
  CHECK(npc({"--command", "clear-locks"}).exit_code == 0);
  r = npc(with_trial({}));  // collect-and-compile
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("Total successful compilations: 2") != std::string::npos);
  CHECK(m.compiles() == 4);
  // Training after it compiles nothing and waits for nothing.
  auto train = test::run(client_sim(m.mnt(), dir / "client.log", {}, graphs));
  CHECK(sim_summary(train.output)["hits"] == 2);
  CHECK_FALSE(fs::exists(dir / "client.log"));
  CHECK(npc({"--command", "clean"}).exit_code == 0);
  CHECK(fs::is_empty(m.backing()));
}
