// The daemon's life: start-up refusals, background mode, signals, several daemons on one
// backing folder, kill -9 and restart mid-compile, the kernel's request timeout.
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>

#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

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
  REQUIRE(test::wait_for_mount(dir / "mnt"));
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
  // Admission by count: this test is about takeover, and under the shared memory ledger the
  // first compiles of graphs never seen run one at a time host-wide, so daemon a might get
  // none to be killed in.
  const std::vector<std::string> env{"NEFFCACHE_FAKE_SECONDS=1", "NEFFCACHE_FAKE_EXCLUSIVE_DIR=" + exclusive.path().string(),
                                     "NEFFCACHE_MEM_BUDGET=off"};
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

TEST_CASE("a daemon that goes to the background compiles and stops", "[fuse]") {
  // Without -f the daemon forks after mounting. Its threads used to start before the
  // fork, which kept only the main thread: every open of a pending NEFF then hung.
  test::TempDir dir;
  fs::create_directories(dir / "mnt");
  const std::string rel = "neuronxcc-2.21.0/MODULE_bg+0";
  fs::create_directories(dir / "backing" / rel);
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", dir / "backing" / rel / "model.hlo_module.pb");
  auto started = test::run({test::path::daemon, "--compiler", k_fake + " compile --framework=XLA --target=trn1 {hlo} "
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

// systemd's notify protocol, as a unit of Type=notify sees it (packaging/systemd/): a datagram
// socket named by NOTIFY_SOCKET that gets READY=1 once the mount is there, and STOPPING=1 at a
// stop. Also the bad --metrics-file and --metrics-interval that a unit's settings may hold.
TEST_CASE("neffcachefs tells systemd it is ready once mounted, and when it stops", "[fuse]") {
  test::TempDir dir;
  const std::string socket_path = (dir / "notify").string();
  neffcache::detail::UniqueFd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  REQUIRE(sock);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(socket_path.size() < sizeof addr.sun_path);
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  REQUIRE(::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  timeval wait{10, 0};
  REQUIRE(::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait) == 0);
  auto next_message = [&] {
    char buf[4096];
    ssize_t n = ::recv(sock.get(), buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  };
  Mount m({"NOTIFY_SOCKET=" + socket_path});
  const std::string ready = next_message();
  CHECK(ready.starts_with("READY=1\n"));
  CHECK(ready.find("mounted on " + m.mnt().string()) != std::string::npos);
  CHECK(m.stop(SIGTERM) == 0);
  CHECK(next_message() == "STOPPING=1");

  auto start = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{k_daemon, "--foreground", "--compiler", k_fake + " {hlo} --output {neff}"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {m.backing().string(), m.mnt().string()});
    return test::run(argv);
  };
  auto r = start({"--metrics-file", (dir / "no-such-folder" / "x.prom").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.starts_with("neffcachefs: error: --metrics-file: cannot create files in "));
  for (const char* interval : {"0", "0.01", "1e20", "nan"}) {
    r = start({"--metrics-file", (dir / "x.prom").string(), "--metrics-interval", interval});
    CHECK(r.exit_code == 1);
    CHECK(r.output == "neffcachefs: error: --metrics-interval must be from 0.1 to 86400 seconds\n");
  }
  r = start({"--metrics-file", (m.mnt() / "x.prom").string()});  // the daemon would wait for itself
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("is inside the mount point") != std::string::npos);
  CHECK_FALSE(mounted(m.mnt()));
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
  std::map<int, int> exits;  // the reader's exit codes, counted
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
    // Whole, or cut off with the connection: never partial (2). A cut reads as ECONNABORTED
    // or ENOTCONN (3), and now and then as EIO from the open (5) or a read (6): the kernel's,
    // when a worker of the dying daemon takes the request into a page of its buffer not yet
    // touched (docs/RELIABILITY.md, "EIO from a daemon killed by kill -9"). The last daemon
    // below must still serve every entry whole.
    CHECK((rc == 0 || rc == 3 || rc == 5 || rc == 6));
    (rc == 0 ? whole : cut_off) += 1;
    ++exits[rc];
  }  // each mount is lazily unmounted
  INFO(fmt::format("answered {} ms after the open; {} whole, {} cut off", answer_after.count(), whole, cut_off));
  for (const auto& [rc, n] : exits) fmt::print(stderr, "kill -9 cycles: reader exit {}: {}\n", rc, n);
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
