// Admission by memory: what the host can give (RAM and cgroup limits), the ledger every
// process shares, peaks predicted from earlier compiles, and the scheduler starting a
// compile only when its prediction fits, passing a waiting large graph a bounded number
// of times, and retrying a compile killed for lack of memory with a larger reservation.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

#include <neffcache/compile/memory.hpp>
#include <neffcache/compile/peaks.hpp>
#include <neffcache/compile/scheduler.hpp>

#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;
using Catch::Approx;

namespace {

constexpr uint64_t MiB = 1 << 20;

void put_text(const test::fs::path& p, const std::string& text) {
  test::fs::create_directories(p.parent_path());
  REQUIRE(detail::write_file_atomic(p.string(), text));
}

// A content identity of graph number n (the history files peaks under it).
std::string key_of(int n, const std::string& flags = "0badcafe") {
  return fmt::format("neuronxcc-2.21.0/{:064x}+{}", n, flags);
}

}  // namespace

TEST_CASE("the host's memory is the tightest of RAM and the cgroup limits, v2 and v1", "[memory]") {
  test::TempDir t;
  put_text(t / "proc/meminfo", "MemTotal:       24576000 kB\nMemFree:  1 kB\n");
  // The host's memory once `files` (a path below t, its text) are written, in order.
  auto memory_with = [&](std::initializer_list<std::pair<const char*, const char*>> files) {
    for (const auto& [path, text] : files) put_text(t / path, text);
    return host_memory((t / "proc").string(), (t / "cg").string());
  };
  SECTION("no cgroup file: RAM") {
    auto m = memory_with({});
    CHECK(m.ram == 24576000ull << 10);
    CHECK_FALSE(m.cgroup_max);
    CHECK(default_mem_budget(m) == static_cast<uint64_t>(static_cast<double>(m.ram) * 0.85));
  }
  SECTION("v2: the tightest of memory.max and memory.high up the tree") {
    auto m = memory_with({{"proc/self/cgroup", "0::/jobs/build\n"},
                          {"cg/jobs/build/memory.max", "max\n"},
                          {"cg/jobs/build/memory.high", "3221225472\n"},
                          {"cg/jobs/memory.max", "2147483648\n"}});
    REQUIRE(m.cgroup_max);
    CHECK(*m.cgroup_max == 2147483648ull);
    CHECK(m.cgroup == "/jobs");
    CHECK(m.limit() == 2147483648ull);
  }
  SECTION("v1: memory.limit_in_bytes, 'unlimited' ignored") {
    auto m = memory_with({{"proc/self/cgroup", "12:cpu,cpuacct:/x\n7:memory:/batch/one\n0::/\n"},
                          {"cg/memory/batch/one/memory.limit_in_bytes", "9223372036854771712\n"},
                          {"cg/memory/batch/memory.limit_in_bytes", "1610612736\n"}});
    REQUIRE(m.cgroup_max);
    CHECK(*m.cgroup_max == 1610612736ull);
  }
  SECTION("a limit above RAM does not raise it") {
    auto m = memory_with({{"proc/self/cgroup", "0::/big\n"}, {"cg/big/memory.max", "99999999999999\n"}});
    CHECK(m.limit() == 24576000ull << 10);
  }
}

TEST_CASE("a memory budget is off, a size or a share", "[memory]") {
  HostMemory m{.ram = 1000 * MiB, .cgroup_max = 800 * MiB, .cgroup = "/x"};
  CHECK(parse_mem_budget("off", m)->off);
  CHECK(parse_mem_budget("48GiB", m)->bytes == 48ull << 30);
  CHECK(parse_mem_budget("50%", m)->bytes == 400 * MiB);
  for (const char* bad : {"", "0", "-1G", "150%", "0%", "lots", "12XB", "%"}) CHECK_FALSE(parse_mem_budget(bad, m));
}

TEST_CASE("processes see each other's reservations in the ledger; a dead one's are dropped", "[memory]") {
  test::TempDir t;
  const std::string dir = (t / "ledger").string();
  auto a = MemoryLedger::open(dir, 1000 * MiB, "a").value();
  auto b = MemoryLedger::open(dir, 1000 * MiB, "b").value();
  CHECK((test::fs::status(dir).permissions() & test::fs::perms::sticky_bit) != test::fs::perms::none);
  auto take = [](MemoryLedger& l, uint64_t n, uint64_t* seen = nullptr) {
    return l.admit([&](MemoryLedger::Admission& a) -> uint64_t {
      if (seen) *seen = a.held;
      a.what = "graph";
      return n;
    });
  };
  auto id = take(*a, 300 * MiB);
  CHECK(id != 0);
  uint64_t seen = 0;
  auto id2 = take(*b, 200 * MiB, &seen);
  CHECK(seen == 300 * MiB);
  take(*a, 0, &seen);
  CHECK(seen == 500 * MiB);
  CHECK(a->holders().size() == 2);

  // A record left by a process that is gone (a child's, after it exited) is not counted.
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  const auto start = detail::process_start_time(child);
  ::waitpid(child, nullptr, 0);
  put_text(test::fs::path(dir) / fmt::format("{}-{}-0", child, start.value_or(1)), R"({"reserved": 700000000})");
  take(*a, 0, &seen);
  CHECK(seen == 500 * MiB);
  CHECK_FALSE(test::fs::exists(test::fs::path(dir) / fmt::format("{}-{}-0", child, start.value_or(1))));

  a->release(id);
  b->release(id2);
  take(*a, 0, &seen);
  CHECK(seen == 0);
  // Nothing held: no records left.
  std::size_t records = 0;
  for (auto& e : test::fs::directory_iterator(dir)) records += e.path().filename().string()[0] != '.';
  CHECK(records == 0);
}

TEST_CASE("peaks are predicted from the same graph, then the nearest graphs, else the default", "[memory]") {
  test::TempDir t;
  PeakHistory h((t / "peaks").string(), 64ull << 30);
  auto kib = [](const PeakPrediction& p) { return static_cast<double>(p.bytes) / 1024 / k_peak_headroom; };
  CHECK(h.predict(key_of(1), 1000, 0).basis == PeakPrediction::Basis::unseen);
  CHECK(h.predict(key_of(1), 1000, 0).bytes == 64ull << 30);
  h.add(key_of(1), 1000, 10, 100'000);
  h.add(key_of(2), 3000, 30, 300'000);
  // The same graph: its own peak.
  CHECK(h.predict(key_of(1), 1000, 0).basis == PeakPrediction::Basis::same_graph);
  CHECK(kib(h.predict(key_of(1), 1000, 0)) == Approx(100'000));
  // Between two: interpolated; larger than all: in proportion; smaller: never scaled down.
  CHECK(h.predict(key_of(3), 2000, 0).basis == PeakPrediction::Basis::neighbours);
  CHECK(kib(h.predict(key_of(3), 2000, 0)) == Approx(200'000));
  CHECK(kib(h.predict(key_of(4), 6000, 0)) == Approx(600'000));
  CHECK(kib(h.predict(key_of(5), 500, 0)) == Approx(100'000));
  // Counts unknown: by HLO bytes.
  CHECK(kib(h.predict(key_of(6), 0, 20)) == Approx(200'000));
  // A peak with a part that does not grow with the graph: larger graphs follow the line
  // through the smallest and the largest seen, not a proportion of the largest.
  const std::string flags = "0badf1a9";
  h.add(key_of(20, flags), 100, 0, 50'000);
  CHECK(kib(h.predict(key_of(21, flags), 10'000, 0)) == Approx(5'000'000));  // one size: in proportion
  CHECK(kib(h.predict(key_of(21, flags), 100'000'000, 0)) == Approx((64ull << 30) / 1024.0));  // up to the default
  h.add(key_of(22, flags), 1000, 0, 59'000);
  CHECK(kib(h.predict(key_of(21, flags), 10'000, 0)) == Approx(149'000));
  // Other flags or compiler: nothing known.
  CHECK(h.predict(key_of(3, "12345678"), 2000, 0).basis == PeakPrediction::Basis::unseen);
  CHECK(h.predict("entry:/some/where", 2000, 0).basis == PeakPrediction::Basis::unseen);

  // Another process's history (the same folder) knows them, and adds to them.
  PeakHistory other((t / "peaks").string());
  CHECK(kib(other.predict(key_of(3), 2000, 0)) == Approx(200'000));
  other.add(key_of(7), 2000, 20, 900'000);
  CHECK(kib(h.predict(key_of(8), 2000, 0)) == Approx(900'000));
}

namespace {

// Compiles nothing: records how many run at once and what each was admitted with, and
// reports the peak the test gives its key.
struct FakeCompiles {
  std::mutex mu;
  std::map<std::string, uint64_t> peak_kib;  // by entry
  std::map<std::string, int> oom_until;      // entry -> runs killed for lack of memory first
  std::vector<std::string> order;
  std::vector<uint64_t> admitted_kib;
  std::atomic<int> running{0}, max_running{0};
  std::chrono::milliseconds take{150ms};

  CompileResult operator()(const std::string& entry, const CompileSettings& s) {
    int now = ++running;
    for (int seen = max_running.load(); now > seen && !max_running.compare_exchange_weak(seen, now);) {}
    uint64_t peak;
    bool oom = false;
    {
      std::lock_guard lk(mu);
      order.push_back(entry);
      admitted_kib.push_back(s.predicted_peak_kib);
      peak = peak_kib[entry];
      if (oom_until[entry] > 0) --oom_until[entry], oom = true;
    }
    std::this_thread::sleep_for(take);
    --running;
    CompileResult r = CompileResult::of(oom ? CompileOutcome::transient : CompileOutcome::success);
    r.attempts = 1;
    r.peak_rss_kib = static_cast<long>(oom ? peak / 2 : peak);
    r.oom_killed = oom;
    if (oom) r.message = "compiler killed for lack of memory";
    return r;
  }
};

// Another process's reservation of `bytes`. (The name is written a character at a
// time: GCC 12 at -O3 warns falsely (-Wrestrict) about a literal assigned once inlined.)
uint64_t hold_bytes(MemoryLedger& ledger, uint64_t bytes) {
  return ledger.admit([bytes](MemoryLedger::Admission& a) -> uint64_t {
    a.what.push_back('x');
    return bytes;
  });
}

Scheduler::Options memory_options(FakeCompiles& fake, std::shared_ptr<MemoryLedger> ledger,
                                  std::shared_ptr<PeakHistory> peaks, int jobs) {
  Scheduler::Options o;
  o.jobs = jobs;
  o.compile = [&fake](const std::string& e, const CompileSettings& s) { return fake(e, s); };
  o.settled = nullptr;
  o.reuse = nullptr;
  o.record = nullptr;
  o.memory = std::move(ledger);
  o.peaks = std::move(peaks);
  return o;
}

// A 1000 MiB ledger of which another process holds half, and the history of a big graph
// (key_of(100), 840 MiB predicted) that cannot fit until the other releases its share.
struct BigGraphBlocked {
  BigGraphBlocked() {
    peaks->add(key_of(100), 10'000, 0, 700 * 1024);
    fake.take = 50ms;
  }
  // A scheduler's options on the ledger: `jobs` at once, the big graph passed by at most
  // `max_bypass` others.
  Scheduler::Options options(int jobs, int max_bypass) {
    auto o = memory_options(fake, ledger, peaks, jobs);
    o.max_bypass = max_bypass;
    return o;
  }

  test::TempDir t;
  const std::string dir = (t / "ledger").string();
  std::shared_ptr<MemoryLedger> ledger = MemoryLedger::open(dir, 1000 * MiB).value();
  std::shared_ptr<MemoryLedger> other = MemoryLedger::open(dir, 1000 * MiB, "other").value();
  uint64_t held = hold_bytes(*other, 500 * MiB);
  std::shared_ptr<PeakHistory> peaks = std::make_shared<PeakHistory>();
  FakeCompiles fake;
};

}  // namespace

TEST_CASE("compiles start only when their predicted peak fits, however many slots", "[memory][scheduler]") {
  test::TempDir t;
  auto ledger = MemoryLedger::open((t / "ledger").string(), 1000 * MiB).value();
  auto peaks = std::make_shared<PeakHistory>();
  FakeCompiles fake;
  SECTION("peaks known: 2 of 400 MiB (480 with headroom) at once in 1000 MiB") {
    for (int i = 0; i < 6; ++i) peaks->add(key_of(i), 1000, 0, 400 * 1024);
    Scheduler s(memory_options(fake, ledger, peaks, 8));
    for (int i = 0; i < 6; ++i) s.submit({fmt::format("e{}", i), key_of(i), 1000, 0}, Priority::background);
    s.wait_idle();
    CHECK(fake.max_running == 2);
    CHECK(s.progress().done == 6);
    CHECK(s.progress().memory_reserved == 0);
    for (auto kib : fake.admitted_kib) CHECK(kib == 480 * 1024);
  }
  SECTION("never seen: the default is larger than the budget, so one at a time, and the peaks are learned") {
    Scheduler s(memory_options(fake, ledger, peaks, 8));
    for (int i = 0; i < 4; ++i) fake.peak_kib[fmt::format("e{}", i)] = 100 * 1024;
    for (int i = 0; i < 4; ++i) s.submit({fmt::format("e{}", i), key_of(i), 1000, 0}, Priority::background);
    s.wait_idle();
    // The first runs alone; once its peak is known the equal-sized rest are predicted
    // from it and run together.
    CHECK(fake.max_running == 3);
    CHECK(fake.admitted_kib[0] == (64ull << 30) >> 10);
    CHECK(peaks->predict(key_of(9), 1000, 0).basis == PeakPrediction::Basis::neighbours);
  }
  SECTION("without a ledger: by count only") {
    Scheduler s(memory_options(fake, nullptr, peaks, 3));
    for (int i = 0; i < 6; ++i) s.submit({fmt::format("e{}", i), key_of(i), 1000, 0}, Priority::background);
    s.wait_idle();
    CHECK(fake.max_running == 3);
  }
}

TEST_CASE("a large graph waiting for memory is passed by smaller ones at most max_bypass times", "[memory][scheduler]") {
  BigGraphBlocked blocked;
  auto& [t, dir, ledger, other, held, peaks, fake] = blocked;
  for (int i = 0; i < 10; ++i) peaks->add(key_of(i), 100, 0, 50 * 1024);  // small: 60 MiB
  Scheduler s(blocked.options(1, 3));
  s.submit({"big", key_of(100), 10'000, 0}, Priority::background);
  for (int i = 0; i < 10; ++i) s.submit({fmt::format("small{}", i), key_of(i), 100, 0}, Priority::background);
  // Three small ones pass, then nothing starts while the big one cannot fit.
  for (int i = 0; i < 100 && s.progress().done < 3; ++i) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(400ms);
  CHECK(s.progress().done == 3);
  CHECK(s.progress().waiting_for_memory);
  other->release(held);
  s.wait_idle();
  std::lock_guard lk(fake.mu);
  REQUIRE(fake.order.size() == 11);
  CHECK(fake.order[3] == "big");
}

TEST_CASE("a job that would not fit beside the waiting large graph does not pass it", "[memory][scheduler]") {
  BigGraphBlocked blocked;
  auto& [t, dir, ledger, other, held, peaks, fake] = blocked;
  peaks->add(key_of(50), 5'000, 0, 250 * 1024);  // medium: 300 MiB, fits now, not beside big
  peaks->add(key_of(1), 100, 0, 50 * 1024);      // small: 60 MiB, fits beside big
  Scheduler s(blocked.options(2, 10));
  s.submit({"big", key_of(100), 10'000, 0}, Priority::background);
  s.submit({"medium", key_of(50), 5'000, 0}, Priority::background);
  s.submit({"small", key_of(1), 100, 0}, Priority::background);
  for (int i = 0; i < 100 && s.progress().done < 1; ++i) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(300ms);
  {
    std::lock_guard lk(fake.mu);
    CHECK(fake.order == std::vector<std::string>{"small"});
  }
  CHECK(s.progress().waiting_for_memory);
  other->release(held);
  s.wait_idle();
  std::lock_guard lk(fake.mu);
  CHECK(fake.order == std::vector<std::string>{"small", "big", "medium"});
}

TEST_CASE("a graph waiting for memory in one process is not passed for ever by another's small ones", "[memory][scheduler]") {
  test::TempDir t;
  const std::string dir = (t / "ledger").string();
  auto peaks = std::make_shared<PeakHistory>();
  for (int i = 0; i < 30; ++i) peaks->add(key_of(i), 100, 0, 50 * 1024);  // 60 MiB each
  FakeCompiles fake;
  fake.take = 100ms;
  Scheduler small(memory_options(fake, MemoryLedger::open(dir, 1000 * MiB, "small").value(), peaks, 2));
  for (int i = 0; i < 30; ++i) small.submit({fmt::format("small{}", i), key_of(i), 100, 0}, Priority::background);
  for (int i = 0; i < 100 && small.progress().running == 0; ++i) std::this_thread::sleep_for(10ms);
  // Another process's graph never seen: predicted larger than the budget, so it needs the
  // host to itself, which the first process would never leave it without the ledger's claim.
  Scheduler large(memory_options(fake, MemoryLedger::open(dir, 1000 * MiB, "large").value(),
                                 std::make_shared<PeakHistory>(), 1));
  large.submit({"large", key_of(100), 100'000, 0}, Priority::background);
  large.wait_idle();
  small.wait_idle();
  std::lock_guard lk(fake.mu);
  REQUIRE(fake.order.size() == 31);
  const auto at = std::find(fake.order.begin(), fake.order.end(), "large") - fake.order.begin();
  CHECK(at < 10);  // once the compiles running when it came had ended, not after all 30
}

TEST_CASE("a compile killed for lack of memory is retried with a larger reservation, never recorded", "[memory][scheduler]") {
  test::TempDir t;
  auto ledger = MemoryLedger::open((t / "ledger").string(), 100ull << 30).value();
  auto peaks = std::make_shared<PeakHistory>();
  peaks->add(key_of(1), 1000, 0, 1000 * 1024);
  FakeCompiles fake;
  fake.take = 10ms;
  fake.peak_kib["e"] = 4000 * 1024;  // killed at 2000 MiB, the first run
  fake.oom_until["e"] = 1;
  Scheduler s(memory_options(fake, ledger, peaks, 2));
  auto r = s.submit({"e", key_of(2), 1000, 0}, Priority::waiting).get();
  CHECK(r.outcome == CompileOutcome::success);
  CHECK(s.progress().oom_kills == 1);
  REQUIRE(fake.admitted_kib.size() == 2);
  CHECK(fake.admitted_kib[0] == 1200 * 1024);
  // max(2 x 1200, 1.5 x 2000) MiB
  CHECK(fake.admitted_kib[1] == 3000 * 1024);

  SECTION("killed every time: a transient failure once the retries are spent") {
    fake.oom_until["f"] = 100;
    auto f = s.submit({"f", key_of(3), 1000, 0}, Priority::waiting).get();
    CHECK(f.outcome == CompileOutcome::transient);
    CHECK(f.message.find("4 times") != std::string::npos);
    CHECK(s.progress().oom_kills == 1 + 4);
  }
}
