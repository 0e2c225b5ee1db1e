// Our own tools and the client simulator through a mount: neffcache compile and
// neuron_parallel_compile ask the daemon, the client's extraction and training runs.
#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

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
                      "NEURON_COMPILE_CACHE_URL=" + m.mnt().string(), test::path::npc, "--compiler",
                      "no-such-cc {hlo} {neff}", (dir / "train.sh").string()});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("INFO ||NEURON_PARALLEL_COMPILE||: Total successful compilations: 2") != std::string::npos);
  CHECK(m.compiles() == 2);
}

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
  CHECK(read_all(entries[2] / "model.neff").first == ENOENT);  // still recorded: no NEFF shown
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
  CHECK(test::only_private_left(m.backing()));
}

TEST_CASE("every neuron_parallel_compile --command on a mount, with the client simulator as trial run", "[fuse]") {
  Mount m;
  test::TempDir dir;
  const std::vector<std::string> graphs{"spu_tf_jit_comp.hlo.pb", "rocm08_normal_9.hlo_proto.pb"};
  auto npc = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{"env", "-C", dir.path().string(), "-u", "NEURON_CC_FLAGS", "-u",
                                  "NEURON_EXTRACT_GRAPHS_ONLY", "NEURON_COMPILE_CACHE_URL=" + m.mnt().string(),
                                  test::path::npc, "--compiler", "no-such-cc {hlo} {neff}"};
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
  CHECK(test::only_private_left(m.backing()));
}
