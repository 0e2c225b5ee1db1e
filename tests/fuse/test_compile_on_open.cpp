// Compile on open through a real mount: one compile for many readers and for graphs that
// differ only in debug information, compiler errors and kills, waits that end, bad graphs.
#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

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

TEST_CASE("a NEFF published while a client looks it up is found, never a missing name", "[fuse]") {
  // Another publisher (another host on shared storage, a tool on the backing folder) can
  // finish between the daemon's two looks at a pending entry's NEFF: its name, then the
  // folder's listing that decides whether a placeholder shows. A disk never answers
  // ENOENT for a file that existed before the lookup returned. Thousands of other names
  // in the entry make the listing, and so that window, last milliseconds (ext4, whose
  // hashed listing puts a new name anywhere; a tmpfs lists it first).
  test::Ext4Image backing("256m", 200000);
  Mount m({}, {}, backing.path());
  test::spit(m.backing() / "neff", "published");
  int missing = 0;
  for (int i = 0; i < 8; ++i) {
    const auto e = m.entry("gopjrt_tuple.hlo.pb", fmt::format("race{}+0", i));
    int made = 0;
    for (int k = 0; k < 20000; ++k)
      made += ::mknod((m.backing() / e / fmt::format("other-{}-{}", i, k)).c_str(), S_IFREG | 0644, 0) == 0;
    REQUIRE(made == 20000);
    const auto neff = m.mnt() / e / "model.neff";
    std::atomic<bool> go{false};
    std::thread looker([&] {
      while (!go) {
      }
      struct stat st {};
      if (::stat(neff.c_str(), &st) != 0) ++missing;  // the first lookup of the name
    });
    go = true;
    std::this_thread::sleep_for(std::chrono::microseconds(100 + 50 * i));
    fs::copy_file(m.backing() / "neff", m.backing() / "neff.tmp");
    fs::rename(m.backing() / "neff.tmp", m.backing() / e / "model.neff");
    looker.join();
  }
  CHECK(missing == 0);
  CHECK(m.compiles() == 0);  // stat does not compile
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
  // From the record, as on a disk: no model.neff now, no second compile.
  CHECK(read_all(m.mnt() / e / "model.neff").first == ENOENT);
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
  Mount m({"NEFFCACHE_FAKE_SIGNAL_ONCE=" + (marker_dir / "died").string(), "NEFFCACHE_FAKE_ONCE_SIGNAL=TERM"});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "d+0");
  CHECK(read_all(m.mnt() / e / "model.neff").first == EIO);
  CHECK_FALSE(fs::exists(m.backing() / e / "model.log"));
  auto [err, bytes] = read_all(m.mnt() / e / "model.neff");
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(bytes).has_value());
  CHECK(m.compiles() == 2);
}

TEST_CASE("a compiler killed for lack of memory is compiled again at once, with a larger reservation", "[fuse]") {
  test::TempDir marker_dir;
  // SIGKILL once: what the kernel's out-of-memory killer does.
  Mount m({"NEFFCACHE_FAKE_SIGNAL_ONCE=" + (marker_dir / "died").string()});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "oom+0");
  auto [err, bytes] = read_all(m.mnt() / e / "model.neff");
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(bytes).has_value());
  CHECK(m.compiles() == 2);
  CHECK_FALSE(fs::exists(m.backing() / e / "model.log"));
  auto memory = nlohmann::json::parse(read_all(m.mnt() / ".neffcache" / "stats.json").second)["memory"];
  CHECK(memory["oom_kills"] == 1);
  CHECK(memory["budget"].is_number());
  CHECK(memory["reserved"] == 0);
  // The retry's reservation is in the entry's metadata: twice the first (64 GiB, never seen).
  auto meta = nlohmann::json::parse(test::slurp(m.backing() / e / ".neffcache-meta.json"));
  CHECK(meta["oom_retries"] == 1);
  CHECK(meta["predicted_peak_kib"] == (128ull << 30) >> 10);
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
  // Recorded: as on a disk, a failed entry has no model.neff to open, and no second compile.
  for (const auto& [name, bytes] : bad)
    CHECK(read_all(m.mnt() / "neuronxcc-2.21.0" / ("MODULE_" + name) / "model.neff").first == ENOENT);
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
