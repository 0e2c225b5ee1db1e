// The scheduler: single flight, canonical dedup, bounded parallelism, order, locked
// entries, shutdown.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/compile/batch.hpp>
#include <neffcache/compile/scheduler.hpp>
#include <neffcache/compile/prepare.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;

namespace {

using test::k_fake;

std::string make_sched_entry(const test::fs::path& root, const std::string& corpus_file, const std::string& name = "") {
  auto dir = root / "neuronxcc-2.21.0" / ("MODULE_" + (name.empty() ? corpus_file : name));
  test::fs::create_directories(dir);
  test::fs::copy_file(test::k_corpus / corpus_file, dir / "model.hlo_module.pb");
  return dir.string();
}

Scheduler::Options fake_compiler_options(const test::TempDir& work, int jobs) {
  Scheduler::Options o;
  o.jobs = jobs;
  o.settings.compiler = CompilerTemplate::parse(k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}").value();
  o.settings.workdir_root = work.path().string();
  o.settings.kill_grace = 500ms;
  return o;
}

// Stands in for the compiler: writes a NEFF, records the order and concurrency of
// runs, and can hold the first run until the test opens the gate.
class RecordingRunner final : public ProcessRunner {
 public:
  Result<RunResult> run(const RunSpec& spec) override {
    std::string key;
    for (std::size_t i = 0; i + 1 < spec.argv.size(); ++i)
      if (spec.argv[i] == "--key") key = spec.argv[i + 1];
    int now = ++running_;
    for (int seen = max_.load(); now > seen && !max_.compare_exchange_weak(seen, now);) {}
    {
      std::unique_lock lk(mu_);
      order_.push_back(key);
      // (Until `concurrency_` ran at once, or 10 s passed.)
      together_.notify_all();
      together_.wait_for(lk, std::chrono::seconds(10), [&] { return max_ >= concurrency_; });
      if (order_.size() == 1 && hold_first_) {
        started_.notify_all();
        gate_.wait(lk, [&] { return open_; });
      }
    }
    std::this_thread::sleep_for(delay_);
    // No Catch2 assertions here: this runs on scheduler threads, and Catch2 3.7's
    // assertion macros are not thread-safe. Failures are counted and checked later.
    for (std::size_t i = 0; i + 1 < spec.argv.size(); ++i)
      if (spec.argv[i] == "--output" && !detail::write_file_atomic(spec.argv[i + 1], "neff for " + key)) ++write_errors_;
    --running_;
    return RunResult{};
  }
  void hold_first() { hold_first_ = true; }
  void wait_first_started() {
    std::unique_lock lk(mu_);
    started_.wait(lk, [&] { return !order_.empty(); });
  }
  void open() {
    std::lock_guard lk(mu_);
    open_ = true;
    gate_.notify_all();
  }
  std::vector<std::string> order() {
    std::lock_guard lk(mu_);
    return order_;
  }
  std::atomic<int> max_{0};
  std::atomic<int> write_errors_{0};
  std::chrono::milliseconds delay_{0};
  // Each run waits until this many ran at once (or 10 s passed): whether the scheduler lets
  // that many run then no longer depends on how fast it prepares the next job.
  int concurrency_ = 0;

 private:
  std::atomic<int> running_{0};
  std::mutex mu_;
  std::condition_variable gate_, started_, together_;
  std::vector<std::string> order_;
  bool hold_first_ = false, open_ = false;
};

Scheduler::Options recording_options(const test::TempDir& work, RecordingRunner& runner, int jobs) {
  Scheduler::Options o;
  o.jobs = jobs;
  o.settings.compiler = CompilerTemplate::parse("fake {hlo} --output {neff} --key {key}").value();
  o.settings.workdir_root = work.path().string();
  o.settings.runner = &runner;
  // A stand-in compiler that cannot be asked: the version of the folder its entries are in.
  o.settings.compiler_version = std::string(test::k_fake_version);
  return o;
}

}  // namespace

TEST_CASE("64 concurrent requests for one entry cause one compile", "[scheduler]") {
  test::TempDir root, work;
  test::ScopedEnv seconds("NEFFCACHE_FAKE_SECONDS", "0.3");
  test::ScopedEnv log("NEFFCACHE_FAKE_LOG", (work / "compiles.log").string());
  auto entry = make_sched_entry(root.path(), "spu_credit_fraud_test.hlo.pb");
  Scheduler sched(fake_compiler_options(work, 2));
  std::atomic<bool> go{false};
  std::atomic<int> callbacks{0};
  std::vector<std::shared_future<CompileResult>> futures(64);
  std::vector<std::thread> threads;
  for (int i = 0; i < 64; ++i)
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      futures[i] = sched.submit(prepare_job(entry), i % 2 ? Priority::waiting : Priority::background,
                                [&](const CompileResult& r) { callbacks += r.outcome == CompileOutcome::success; });
    });
  go = true;
  for (auto& t : threads) t.join();
  for (auto& f : futures) CHECK(f.get().outcome == CompileOutcome::success);
  sched.wait_idle();
  CHECK(callbacks == 64);
  CHECK(test::count_lines(work / "compiles.log") == 1);
  CHECK(sched.progress().total == 1);
  CHECK(sched.progress().done == 1);
}

TEST_CASE("entries with canonically equal graphs compile once and all get the NEFF", "[scheduler]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv log("NEFFCACHE_FAKE_LOG", (work / "compiles.log").string());
  auto a = make_sched_entry(root.path(), "rocm_normal_9.hlo_proto.pb", "a+0");
  auto b = make_sched_entry(root.path(), "rocm_normal_9.hlo_proto.pb", "b+0");
  auto c = make_sched_entry(root.path(), "spu_tf_jit_comp.hlo.pb", "c+0");
  REQUIRE(prepare_job(a).dedup_key == prepare_job(b).dedup_key);
  REQUIRE(prepare_job(a).dedup_key != prepare_job(c).dedup_key);
  {
    Scheduler sched(fake_compiler_options(work, 1));
    auto fa = sched.submit(prepare_job(a), Priority::background);
    auto fb = sched.submit(prepare_job(b), Priority::background);
    auto fc = sched.submit(prepare_job(c), Priority::background);
    CHECK(fa.get().outcome == CompileOutcome::success);
    CHECK(fb.get().outcome == CompileOutcome::success);
    CHECK(fc.get().outcome == CompileOutcome::success);
  }
  CHECK(test::count_lines(work / "compiles.log") == 2);
  auto na = fake::parse_fake_neff(test::slurp(test::fs::path(a) / "model.neff"));
  auto nb = fake::parse_fake_neff(test::slurp(test::fs::path(b) / "model.neff"));
  REQUIRE((na && nb));
  CHECK(na->graph == nb->graph);
  CHECK(test::fs::exists(test::fs::path(b) / "model.done"));
  auto copied = test::fs::exists(test::fs::path(b) / ".neffcache-meta.json") &&
                nlohmann::json::parse(test::slurp(test::fs::path(b) / ".neffcache-meta.json")).contains("copied_from");
  auto copied_a = nlohmann::json::parse(test::slurp(test::fs::path(a) / ".neffcache-meta.json")).contains("copied_from");
  CHECK(copied != copied_a);  // one was compiled, the other received a copy
}

TEST_CASE("a failure of a shared graph is recorded in every entry that has it", "[scheduler]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  test::ScopedEnv fail("NEFFCACHE_FAKE_FAIL", "5");
  test::ScopedEnv log("NEFFCACHE_FAKE_LOG", (work / "compiles.log").string());
  auto a = make_sched_entry(root.path(), "gopjrt_tuple.hlo.pb", "a+0");
  auto b = make_sched_entry(root.path(), "gopjrt_tuple.hlo.pb", "b+0");
  Scheduler sched(fake_compiler_options(work, 2));
  auto fa = sched.submit(prepare_job(a), Priority::background);
  auto fb = sched.submit(prepare_job(b), Priority::background);
  CHECK(fa.get().outcome == CompileOutcome::failed);
  CHECK(fb.get().outcome == CompileOutcome::failed);
  CHECK(test::count_lines(work / "compiles.log") == 1);
  CHECK(test::fs::exists(test::fs::path(a) / "model.log"));
  CHECK(test::fs::exists(test::fs::path(b) / "model.log"));
  sched.wait_idle();
  CHECK(sched.progress().failed == 2);
}

TEST_CASE("running compiles never exceed jobs", "[scheduler]") {
  test::TempDir root, work;
  RecordingRunner runner;
  runner.delay_ = 40ms;
  runner.concurrency_ = 3;
  std::vector<std::shared_future<CompileResult>> futures;
  {
    Scheduler sched(recording_options(work, runner, 3));
    for (const auto& f : test::corpus_files())
      futures.push_back(sched.submit(prepare_job(make_sched_entry(root.path(), f.filename().string())), Priority::background));
    for (auto& f : futures) CHECK(f.get().outcome == CompileOutcome::success);
  }
  CHECK(runner.max_ == 3);
  CHECK(runner.write_errors_ == 0);
  CHECK(runner.order().size() == futures.size());
}

TEST_CASE("waited-on requests go first, then the largest graphs, deferred work last", "[scheduler]") {
  test::TempDir root, work;
  RecordingRunner runner;
  runner.hold_first();
  Scheduler sched(recording_options(work, runner, 1));
  auto entry = [&](const char* file) { return prepare_job(make_sched_entry(root.path(), file)); };
  // Instruction counts: x_squared 2, tuple 4, empty_return_tuple 6, normal_9 311, cnn 6612.
  auto first = sched.submit(entry("gopjrt_jax_xp1.hlo.pb"), Priority::background);
  runner.wait_first_started();  // it holds the only slot while the rest queue up
  auto small = entry("gopjrt_x_squared.hlo.pb");
  auto big = entry("spu_jax_cnn.hlo.pb");
  auto waited = entry("gopjrt_tuple.hlo.pb");
  auto medium = entry("rocm_normal_9.hlo_proto.pb");
  auto lifted = entry("spu_empty_return_tuple.hlo.pb");
  auto other_node = entry("spu_credit_fraud_predict.hlo.pb");  // larger than `small`, but another node's
  std::vector<std::shared_future<CompileResult>> f;
  f.push_back(sched.submit(other_node, Priority::deferred));
  f.push_back(sched.submit(small, Priority::background));
  f.push_back(sched.submit(lifted, Priority::background));
  f.push_back(sched.submit(big, Priority::background));
  f.push_back(sched.submit(waited, Priority::waiting));
  f.push_back(sched.submit(medium, Priority::background));
  f.push_back(sched.submit(lifted, Priority::waiting));  // a reader arrives: lifted ahead
  CHECK(sched.progress().queued == 6);
  CHECK(sched.progress().running == 1);
  runner.open();
  for (auto& x : f) CHECK(x.get().outcome == CompileOutcome::success);
  first.get();
  auto name = [](const JobSpec& s) { return test::fs::path(s.entry_dir).filename().string(); };
  CHECK(runner.order() == std::vector<std::string>{"MODULE_gopjrt_jax_xp1.hlo.pb", name(lifted), name(waited),
                                                   name(big), name(medium), name(small), name(other_node)});
}

TEST_CASE("an entry already done or failed is answered at submit, not behind the queue", "[scheduler]") {
  test::TempDir root, work;
  RecordingRunner runner;
  runner.hold_first();
  Scheduler sched(recording_options(work, runner, 1));
  auto first = sched.submit(prepare_job(make_sched_entry(root.path(), "gopjrt_jax_xp1.hlo.pb")), Priority::background);
  runner.wait_first_started();  // the only worker is busy until the gate opens
  auto queued = sched.submit(prepare_job(make_sched_entry(root.path(), "gopjrt_x_squared.hlo.pb")), Priority::waiting);
  auto done = make_sched_entry(root.path(), "gopjrt_tuple.hlo.pb");
  test::spit(test::fs::path(done) / "model.neff", "neff");
  test::spit(test::fs::path(done) / "model.done", "");
  auto failed = make_sched_entry(root.path(), "spu_tf_jit_comp.hlo.pb");
  test::spit(test::fs::path(failed) / "model.log", "it failed");
  int called = 0;
  auto d = sched.submit(prepare_job(done), Priority::waiting, [&](const CompileResult&) { ++called; });
  auto f = sched.submit(prepare_job(failed), Priority::waiting, [&](const CompileResult&) { ++called; });
  REQUIRE(d.wait_for(0s) == std::future_status::ready);
  REQUIRE(f.wait_for(0s) == std::future_status::ready);
  CHECK(called == 2);
  CHECK(d.get().outcome == CompileOutcome::already_done);
  CHECK(f.get().outcome == CompileOutcome::failed_cached);
  auto p = sched.progress();
  CHECK(p.running == 1);
  CHECK(p.queued == 1);
  CHECK(p.total == 4);
  CHECK(p.done == 1);
  CHECK(p.failed == 1);
  runner.open();
  CHECK(first.get().outcome == CompileOutcome::success);
  CHECK(queued.get().outcome == CompileOutcome::success);
  CHECK(runner.order().size() == 2);
}

TEST_CASE("an entry locked elsewhere waits as locked and is re-checked on the clock", "[scheduler]") {
  test::TempDir root, work;
  RecordingRunner runner;
  test::FakeClock clock;
  auto entry = make_sched_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto other = EntryLock::try_acquire(entry + "/model.hlo_module.pb.lock");
  REQUIRE(other.has_value());
  auto o = recording_options(work, runner, 1);
  o.clock = &clock;
  o.busy_retry = 5s;
  Scheduler sched(o);
  auto f = sched.submit(prepare_job(entry), Priority::waiting);
  for (int i = 0; i < 500 && sched.progress().locked == 0; ++i) std::this_thread::sleep_for(2ms);
  CHECK(sched.progress().locked == 1);
  CHECK(sched.progress().remaining() == 1);
  // The other holder finishes the entry. Real time passes, but the clock does not.
  test::spit(test::fs::path(entry) / "model.neff", "theirs");
  test::spit(test::fs::path(entry) / "model.done", "");
  other->release();
  std::this_thread::sleep_for(100ms);
  CHECK(f.wait_for(0s) == std::future_status::timeout);
  clock.advance(5s);
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  CHECK(f.get().outcome == CompileOutcome::already_done);
  CHECK(runner.order().empty());  // never compiled by us
}

TEST_CASE("shutdown stops running compiles and drops queued ones, recording nothing", "[scheduler]") {
  test::TempDir root, work;
  test::ScopedEnv hang("NEFFCACHE_FAKE_HANG", "1");
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  std::vector<std::string> entries;
  for (const char* f : {"gopjrt_tuple.hlo.pb", "gopjrt_x_squared.hlo.pb", "spu_tf_jit_comp.hlo.pb"})
    entries.push_back(make_sched_entry(root.path(), f));
  std::vector<std::shared_future<CompileResult>> futures;
  auto start = std::chrono::steady_clock::now();
  {
    Scheduler sched(fake_compiler_options(work, 1));
    for (auto& e : entries) futures.push_back(sched.submit(prepare_job(e), Priority::background));
    for (int i = 0; i < 500 && sched.progress().running == 0; ++i) std::this_thread::sleep_for(2ms);
    std::this_thread::sleep_for(100ms);
    sched.shutdown();
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  for (auto& f : futures) CHECK(f.get().outcome == CompileOutcome::transient);
  for (auto& e : entries) {
    CHECK_FALSE(test::fs::exists(test::fs::path(e) / "model.log"));
    CHECK_FALSE(test::fs::exists(test::fs::path(e) / "model.hlo_module.pb.lock"));
  }
}

TEST_CASE("job keys follow graph, flags and compiler; jobs default as the Neuron tool's pool", "[scheduler]") {
  test::TempDir root;
  auto a = make_sched_entry(root.path(), "rocm_normal_9.hlo_proto.pb", "a");
  auto b = make_sched_entry(root.path(), "rocm_normal_9.hlo_proto.pb", "b");
  REQUIRE(write_compile_flags(b + "/compile_flags.json", {"-O1"}).has_value());
  CHECK(prepare_job(a).dedup_key != prepare_job(b).dedup_key);
  CHECK(prepare_job(a, {"-O1"}).dedup_key == prepare_job(b).dedup_key);
  CHECK(prepare_job(a).instructions == 311);
  test::spit(test::fs::path(a) / "model.hlo_module.pb", "garbage");
  CHECK(prepare_job(a).dedup_key.empty());

  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  CHECK(default_jobs(1) == cores);
  CHECK(default_jobs(1ull << 62) == 1);
}

TEST_CASE("progress counts compiler runs, not copies", "[scheduler]") {
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto a = make_sched_entry(root.path(), "gopjrt_tuple.hlo.pb", "a+0");
  auto b = make_sched_entry(root.path(), "gopjrt_tuple.hlo.pb", "b+0");
  Scheduler sched(fake_compiler_options(work, 1));
  auto fa = sched.submit(prepare_job(a), Priority::background);
  auto fb = sched.submit(prepare_job(b), Priority::background);
  fa.get();
  fb.get();
  sched.wait_idle();
  auto p = sched.progress();
  CHECK(p.done == 2);
  CHECK(p.compiles_started == 1);
  CHECK(p.compiles_succeeded == 1);
  CHECK(p.compiles_failed + p.compiles_transient == 0);
  CHECK(p.compile_seconds > 0);
}

TEST_CASE("a request made after a result was delivered starts afresh", "[scheduler]") {
  // The window: a callback runs while its job is being retired. A caller that reacts to
  // a failure (clears it, asks again) must get a new compile, not the old result.
  test::TempDir root, work;
  test::ScopedEnv rate("NEFFCACHE_FAKE_RATE", "0");
  auto gate = work / "failing";
  test::touch(gate);
  test::ScopedEnv fail("NEFFCACHE_FAKE_FAIL", "1");
  test::ScopedEnv while_gate("NEFFCACHE_FAKE_FAIL_WHILE", gate.string());
  auto entry = make_sched_entry(root.path(), "gopjrt_tuple.hlo.pb");
  Scheduler sched(fake_compiler_options(work, 1));
  std::promise<std::shared_future<CompileResult>> again;
  auto first = sched.submit(prepare_job(entry), Priority::waiting, [&](const CompileResult& r) {
    if (r.outcome != CompileOutcome::failed) return;
    ::unlink(gate.c_str());
    ::unlink((entry + "/model.log").c_str());
    again.set_value(sched.submit(prepare_job(entry), Priority::waiting));
  });
  CHECK(first.get().outcome == CompileOutcome::failed);
  auto second = again.get_future().get();
  CHECK(second.get().outcome == CompileOutcome::success);
  CHECK(test::fs::exists(test::fs::path(entry) / "model.neff"));
}

TEST_CASE("a batch takes entries while it compiles and reports each one", "[scheduler]") {
  test::TempDir root, work;
  RecordingRunner runner;
  runner.hold_first();
  auto a = make_sched_entry(root.path(), "gopjrt_tuple.hlo.pb");
  auto b = make_sched_entry(root.path(), "rocm08_normal_9.hlo_proto.pb");
  auto failed = make_sched_entry(root.path(), "gopjrt_x_squared.hlo.pb");
  test::spit(test::fs::path(failed) / "model.log", "an earlier failure");  // recorded: not compiled again
  const auto start = std::chrono::system_clock::now();
  Batch batch(recording_options(work, runner, 1), {});
  batch.add(a);
  runner.wait_first_started();
  // Added while the first compile runs, and twice: compiled and reported once.
  batch.add(b);
  batch.add(b);
  batch.add(failed);
  auto c = batch.counts();
  CHECK(c.total == 3);
  CHECK(c.done + c.failed < 3);
  CHECK_FALSE(batch.wait_until(std::chrono::steady_clock::now() + 50ms));
  runner.open();
  batch.wait();
  c = batch.counts();
  CHECK(c.total == 3);
  CHECK(c.done == 2);
  CHECK(c.failed == 1);
  CHECK(c.remaining == 0);
  CHECK(runner.order().size() == 2);
  auto items = batch.items();
  REQUIRE(items.size() == 3);
  CHECK(items[0].entry_dir == a);
  CHECK(items[1].hlo_path == b + "/model.hlo_module.pb");
  CHECK(items[2].result->outcome == CompileOutcome::failed_cached);

  auto report = neuron_report(items, start, 1.5);
  CHECK(report["compilation_summary"]["true"] == 2);
  CHECK(report["compilation_summary"]["false"] == 1);
  CHECK(report["compilation_report"][a + "/model.hlo_module.pb"]["status"] == true);
  CHECK(report["compilation_report"][failed + "/model.hlo_module.pb"]["status"] == false);
  CHECK(report["compilation_report"][a + "/model.hlo_module.pb"]["retry"] == 0);
  CHECK(report["compilation_time"] == 1.5);
  CHECK(report["start_time"].get<double>() == std::chrono::duration<double>(start.time_since_epoch()).count());
}
