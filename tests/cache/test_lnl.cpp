// The LNL dialect's layout: entry paths, states, the lock beside the folder, and
// command.txt read back into a compile of ours.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/cache/nki.hpp>

#include "lnl.hpp"
#include "support.hpp"

using namespace neffcache;

namespace {

EntryState state_at(const test::fs::path& root, const std::string& path) {
  std::optional<EntryState> st;
  REQUIRE(for_each_entry(root.string(), [&](const EntryRef& e) {
            if (e.relative_path() == path) st = entry_state(e);
          }).has_value());
  REQUIRE(st.has_value());
  return *st;
}

}  // namespace

TEST_CASE("LNL entry paths are one 32-hex component; Neuron paths keep their shape", "[lnl]") {
  const std::string key = test::lnl_key("a");
  CHECK(is_entry_path(key));
  CHECK(dialect_of_path(key) == Dialect::lnl);
  CHECK(dialect_of_path("neuronxcc-2.21.0/MODULE_1+2") == Dialect::neuron);
  CHECK_FALSE(is_entry_path(key.substr(1)));        // 31 digits
  CHECK_FALSE(is_entry_path(key + "0"));            // 33
  CHECK_FALSE(is_entry_path("A" + key.substr(1)));  // upper case is not LNL's
  CHECK_FALSE(is_entry_path(key + "/graph.hlo"));
  CHECK_FALSE(is_entry_path("nki"));
  CHECK(lnl_neff_name(key) == "graph_" + key + ".neff");
}

TEST_CASE("an LNL holder file names a process as a rank reads /proc: its comm, its argv as Python prints a list", "[lnl]") {
  using detail::python_repr;
  CHECK(python_repr(std::vector<std::string>{"/usr/bin/python3", "-m", "vllm"}) == "['/usr/bin/python3', '-m', 'vllm']");
  CHECK(python_repr(std::vector<std::string>{}) == "[]");
  CHECK(python_repr("it's") == "\"it's\"");
  CHECK(python_repr("a'b\"c") == "'a\\'b\"c'");
  CHECK(python_repr("back\\slash\ttab\x01") == "'back\\\\slash\\ttab\\x01'");
  auto self = parse_lnl_holder(lnl_holder_record());
  REQUIRE(self.has_value());
  CHECK(self->pid == ::getpid());
  CHECK_FALSE(self->process_name.empty());
  CHECK(self->cmdline.starts_with("['"));
  CHECK(lnl_holder_alive(*self));
  auto other = *self;
  other.cmdline += " ";
  CHECK_FALSE(lnl_holder_alive(other));  // another command line: another process
  other = *self;
  other.process_name += "x";
  CHECK_FALSE(lnl_holder_alive(other));
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  REQUIRE(gone > 0);
  ::waitpid(gone, nullptr, 0);
  other = *self;
  other.pid = gone;
  CHECK_FALSE(lnl_holder_alive(other));
  CHECK_FALSE(parse_lnl_holder("process_name:python3\ncmdline:[]\n").has_value());  // no pid
}

TEST_CASE("a flock's holder is read from /proc/locks, without taking a lock", "[lnl]") {
  struct stat st {};
  st.st_dev = makedev(8, 1);
  st.st_ino = 123456;
  using detail::proc_locks_list_flock;
  CHECK(proc_locks_list_flock("1: FLOCK  ADVISORY  WRITE 1234 08:01:123456 0 EOF\n", st));
  CHECK(proc_locks_list_flock("7: POSIX  ADVISORY  WRITE 99 00:1f:5 0 EOF\n8: FLOCK  ADVISORY  READ 1 08:01:123456 0 EOF", st));
  CHECK_FALSE(proc_locks_list_flock("1: POSIX  ADVISORY  WRITE 1234 08:01:123456 0 EOF\n", st));    // a record lock
  CHECK_FALSE(proc_locks_list_flock("1: -> FLOCK  ADVISORY  WRITE 1234 08:01:123456 0 EOF\n", st)); // only waiting
  CHECK_FALSE(proc_locks_list_flock("1: FLOCK  ADVISORY  WRITE 1234 08:01:1234567 0 EOF\n", st));   // another file
  CHECK_FALSE(proc_locks_list_flock("1: FLOCK  ADVISORY  WRITE 1234 08:02:123456 0 EOF\n", st));    // another device
  CHECK_FALSE(proc_locks_list_flock("", st));
}

TEST_CASE("LNL entry states: pending, partial, done, failed, compiling under the client's flock", "[lnl]") {
  test::TempDir root;
  const std::string key = test::lnl_key("states");
  auto dir = test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  CHECK(state_at(root.path(), key) == EntryState::pending);

  SECTION("graph.hlo alone is a writer still at work; LNL's metadata makes it a job") {
    test::fs::remove(dir / "command.txt");
    test::fs::remove(dir / ".artifact_metadata_v0.json");
    CHECK(state_at(root.path(), key) == EntryState::empty);
    test::spit(dir / ".artifact_metadata_v0.json", "{}");
    CHECK(state_at(root.path(), key) == EntryState::pending);
  }
  SECTION("graph.hlo and command.txt without LNL's metadata are a client's compile, no job of ours") {
    test::fs::remove(dir / ".artifact_metadata_v0.json");
    CHECK(state_at(root.path(), key) == EntryState::empty);
  }
  SECTION("outputs without the marker are partial, never done") {
    test::spit(dir / lnl_neff_name(key), "half a NEFF");
    CHECK(state_at(root.path(), key) == EntryState::partial);
    test::spit(dir / ".compilation_complete", lnl_marker(1, 11));
    CHECK(state_at(root.path(), key) == EntryState::done);
  }
  SECTION("a log of the compiler's own, without the marker, is partial too") {
    test::spit(dir / "log-neuron-cc.txt", "interrupted");
    CHECK(state_at(root.path(), key) == EntryState::partial);
  }
  SECTION("our failure record; LNL's marker would win over it") {
    test::spit(dir / ".neffcache-failed.log", "ERROR");
    CHECK(state_at(root.path(), key) == EntryState::failed);
  }
  SECTION("a client's flock on <root>/.<key>.compilation_metadata.lock is a compile; the file alone is nothing") {
    auto lock_path = test::lnl_lock(root.path(), key);
    test::spit(lock_path, "");
    CHECK(state_at(root.path(), key) == EntryState::pending);
    int fd = ::open(lock_path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    CHECK(state_at(root.path(), key) == EntryState::compiling);
    auto files = read_entry_files(dir.string());
    REQUIRE(files.has_value());
    CHECK(entry_lock_path(dir.string() + "/", *files) == lock_path.string());
    auto ours = EntryLock::try_acquire_entry(dir.string(), *files);
    REQUIRE_FALSE(ours.has_value());
    CHECK(ours.error().code == Errc::busy);
    ::close(fd);
    CHECK(state_at(root.path(), key) == EntryState::pending);
    {
      auto taken = EntryLock::try_acquire_entry(dir.string(), *files);
      REQUIRE(taken.has_value());
      // The client waits on our lock as on another client's.
      int other = ::open(lock_path.c_str(), O_RDWR);
      CHECK(::flock(other, LOCK_EX | LOCK_NB) != 0);
      ::close(other);
      // And finds a live holder named beside it, this process.
      auto holder = parse_lnl_holder(test::slurp(test::lnl_holder(root.path(), key)));
      REQUIRE(holder.has_value());
      CHECK(holder->pid == ::getpid());
      CHECK(lnl_holder_alive(*holder));
      CHECK(state_at(root.path(), key) == EntryState::compiling);
    }
    CHECK(test::fs::exists(lock_path));  // released, the file stays for its waiters
    CHECK(state_at(root.path(), key) == EntryState::pending);
  }
}

TEST_CASE("one root holds both dialects; the walk finds each with its own files", "[lnl]") {
  test::TempDir root;
  const std::string key = test::lnl_key("both");
  test::make_lnl_entry(root.path(), "gopjrt_tuple.hlo.pb", key);
  auto neuron = root.path() / "neuronxcc-2.21.0" / "MODULE_1+2";
  test::fs::create_directories(neuron);
  test::fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", neuron / "model.hlo_module.pb");
  test::fs::create_directories(root.path() / "nki");                   // LNL's NKI results: no entry
  test::fs::create_directories(root.path() / test::lnl_key("x").substr(0, 31));  // not a key
  std::map<std::string, Dialect> seen;
  REQUIRE(for_each_entry(root.path().string(), [&](const EntryRef& e) { seen[e.relative_path()] = e.files.dialect; })
              .has_value());
  CHECK(seen == std::map<std::string, Dialect>{{key, Dialect::lnl}, {"neuronxcc-2.21.0/MODULE_1+2", Dialect::neuron}});
  auto files = read_entry_files((root.path() / key).string());
  REQUIRE(files.has_value());
  CHECK(files->key == key);
  CHECK(files->hlo_name() == std::optional<std::string_view>("graph.hlo"));
}

TEST_CASE("command.txt is read back: the input, the target apart, the arguments in order", "[lnl]") {
  const std::string key = test::lnl_key("cmd");
  auto c = parse_lnl_command(test::lnl_command_text(key, {"--model-type", "transformer", "-O1", "--verbose=35"}, "trn2"));
  REQUIRE(c.has_value());
  CHECK(c->input.ends_with(key + "/graph.hlo"));
  CHECK(c->framework == "XLA");
  CHECK(c->target == "trn2");
  CHECK(c->flags == std::vector<std::string>{"--model-type", "transformer", "-O1", "--verbose=35"});
  // The key: the target first, no paths, no --verbose in either form.
  CHECK(lnl_key_flags(*c) == std::vector<std::string>{"--target=trn2", "--model-type", "transformer", "-O1"});
  auto spaced = parse_lnl_command("neuronx-cc compile g/graph.hlo --target=trn2 --verbose 35 --model-type transformer -O1");
  REQUIRE(spaced.has_value());
  CHECK(lnl_key_flags(*spaced) == lnl_key_flags(*c));
  // Our compile: the work folder's paths, the entry's own arguments.
  CHECK(lnl_compile_argv("/opt/cc", *c, "/w/graph.hlo", "/w/out.neff", "/w/log") ==
        std::vector<std::string>{"/opt/cc", "compile", "/w/graph.hlo", "--framework", "XLA", "--target", "trn2",
                                 "--output", "/w/out.neff", "--logfile", "/w/log", "--model-type", "transformer", "-O1",
                                 "--verbose=35"});
  // The input found by its name when options come first.
  auto late = parse_lnl_command("/usr/bin/neuronx-cc compile --framework=XLA --target trn1 /c/k/graph.hlo --output o");
  REQUIRE(late.has_value());
  CHECK(late->input == "/c/k/graph.hlo");
  CHECK(late->flags.empty());
}

TEST_CASE("a compile command line is read in each form its callers write it", "[lnl][shim]") {
  // The Neuron wrapper: options first, the input after them, its flags and --verbose last.
  auto neuron = parse_compile_words({"neuronx-cc", "compile", "--target=trn1", "--framework=XLA", "/w/model.MODULE_1+2.hlo_module.pb",
                                     "--output", "/w/model.MODULE_1+2.neff", "--auto-cast", "none", "-O1", "--verbose=35"});
  REQUIRE(neuron.has_value());
  CHECK(neuron->input == "/w/model.MODULE_1+2.hlo_module.pb");
  CHECK(neuron->output == "/w/model.MODULE_1+2.neff");
  CHECK(neuron->logfile.empty());
  CHECK(lnl_key_flags(*neuron) == std::vector<std::string>{"--target=trn1", "--auto-cast", "none", "-O1"});
  // LNL: the input first, a log file asked for.
  auto lnl = parse_compile_words({"neuronx-cc", "compile", "/c/k/graph.hlo", "--framework", "XLA", "--target", "trn2",
                                  "--output", "/c/k/graph_k.neff", "--logfile", "/c/k/log-neuron-cc.txt", "-O1"});
  REQUIRE(lnl.has_value());
  CHECK(lnl->input == "/c/k/graph.hlo");
  CHECK(lnl->logfile == "/c/k/log-neuron-cc.txt");
  CHECK(lnl_key_flags(*lnl) == std::vector<std::string>{"--target=trn2", "-O1"});
  // A value of an unknown option is never taken for the input.
  auto valued = parse_compile_words({"neuronx-cc", "compile", "--model-type", "transformer", "/w/m.pb", "--output", "o"});
  REQUIRE(valued.has_value());
  CHECK(valued->input == "/w/m.pb");
  CHECK(valued->flags == std::vector<std::string>{"--model-type", "transformer"});
  // The wrapper's older order: an option before "compile".
  auto older = parse_compile_words({"neuronx-cc", "--target=trn1", "compile", "--framework=XLA", "/w/m.pb", "--output", "o"});
  REQUIRE(older.has_value());
  CHECK(older->input == "/w/m.pb");
  CHECK(older->target == "trn1");
  CHECK(older->output == "o");
  auto unsure = parse_compile_words({"neuronx-cc", "compile", "-O1", "/w/m.pb", "--output", "o"});
  CHECK_FALSE(unsure.has_value());
  for (const auto& w : std::vector<std::vector<std::string>>{
           {"neuronx-cc", "--version"}, {"neuronx-cc", "compile"}, {"neuronx-cc", "compile", "--help"},
           {"neuronx-cc", "list-operators", "--framework", "XLA"}, {"neuronx-cc", "compile", "m.pb", "--output"}}) {
    CAPTURE(w);
    CHECK_FALSE(parse_compile_words(w).has_value());
  }
}

TEST_CASE("a bad command.txt is one clear error", "[lnl]") {
  for (std::string_view text : {"", "neuronx-cc", "neuronx-cc --version", "neuronx-cc compile --target",
                                "neuronx-cc compile --framework XLA -O1", "neuronx-cc compile 'graph.hlo"}) {
    auto c = parse_lnl_command(text);
    CAPTURE(text);
    REQUIRE_FALSE(c.has_value());
    CHECK(c.error().code == Errc::invalid_argument);
    CHECK(c.error().message.starts_with("command.txt: "));
    CHECK(c.error().message.find('\n') == std::string::npos);
  }
}

TEST_CASE("an NKI kernel is carried by its path inside the kernel folder, and only a plain one", "[lnl][nki]") {
  const std::string dir = "/var/tmp/nki-intermediate-cache";
  CHECK(kernel_relative_path(dir, dir + "/ab/k.klir") == "ab/k.klir");
  CHECK(kernel_relative_path(dir + "/", dir + "/k.klir") == "k.klir");
  CHECK(kernel_relative_path("/", "/k.klir") == "k.klir");
  for (const std::string& other : std::vector<std::string>{dir, dir + "/", "/var/tmp/nki-intermediate-cache2/k.klir", "/etc/passwd",
                                  dir + "/../../../etc/passwd", dir + "/a//k", dir + "/./k", "k.klir", ""})
    CHECK_FALSE(kernel_relative_path(dir, other).has_value());
  CHECK_FALSE(kernel_relative_path("relative/dir", "relative/dir/k").has_value());
  CHECK(is_plain_relative_path("a/b.json"));
  for (std::string_view bad : std::vector<std::string_view>{"", "/a", "a/", "a/../b", "..", ".", "a//b", std::string_view("a\0b", 3)})
    CHECK_FALSE(is_plain_relative_path(bad));
}
