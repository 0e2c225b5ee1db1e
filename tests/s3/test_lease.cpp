// The S3 entry lease against a real radosgw: one holder at a time, expiry and takeover
// by the server's clock, renewal that keeps it, and races decided by the server.
#include <atomic>
#include <filesystem>
#include <chrono>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <neffcache/s3/lease.hpp>
#include <neffcache/s3/tier.hpp>

#include "s3_support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;

namespace {
const std::string k_key = "neuronxcc-2.15/MODULE_1+abc/model.hlo_module.pb.lock";
}

TEST_CASE("an S3 lease has one holder at a time; a release lets the next one in", "[s3][lease]") {
  auto s3 = test::fresh_bucket("lease");
  auto a = S3Lease::acquire(*s3, k_key, 60s, "host-a");
  REQUIRE(a.has_value());
  auto b = S3Lease::acquire(*s3, k_key, 60s, "host-b");
  REQUIRE_FALSE(b.has_value());
  CHECK(b.error().code == Errc::busy);
  CHECK_THAT(b.error().message, ContainsSubstring("host-a"));
  REQUIRE(a->renew().has_value());
  auto seen = read_lease(*s3, k_key);
  REQUIRE(seen.has_value());
  CHECK(seen->record->host == "host-a");
  CHECK_FALSE(seen->expired);

  REQUIRE(a->release().has_value());
  CHECK(read_lease(*s3, k_key)->expired);
  auto b2 = S3Lease::acquire(*s3, k_key, 60s, "host-b");
  REQUIRE(b2.has_value());
  // a's hold is over: it can neither renew nor release b's lease away.
  CHECK(a->renew().error().code == Errc::precondition_failed);
  REQUIRE(a->release().has_value());
  CHECK(read_lease(*s3, k_key)->record->host == "host-b");
  CHECK_FALSE(read_lease(*s3, k_key)->expired);
}

TEST_CASE("an S3 lease left unrenewed expires and is taken over; its holder learns it lost", "[s3][lease]") {
  auto s3 = test::fresh_bucket("expiry");
  auto a = S3Lease::acquire(*s3, k_key, 2s, "crashed-host");
  REQUIRE(a.has_value());
  auto start = std::chrono::steady_clock::now();
  std::optional<S3Lease> b;
  while (!b && std::chrono::steady_clock::now() - start < 10s) {
    auto r = S3Lease::acquire(*s3, k_key, 60s, "host-b");
    if (r) b.emplace(std::move(*r));
    else {
      REQUIRE(r.error().code == Errc::busy);
      std::this_thread::sleep_for(100ms);
    }
  }
  REQUIRE(b.has_value());
  auto waited = std::chrono::steady_clock::now() - start;
  // Judged in whole seconds of the server's clock: strictly more than the ttl passed.
  CHECK(waited > 1s);
  CHECK(waited < 4s);
  auto lost = a->renew();
  REQUIRE_FALSE(lost.has_value());
  CHECK(lost.error().code == Errc::precondition_failed);
  CHECK_THAT(lost.error().message, ContainsSubstring("lease lost"));
  CHECK(read_lease(*s3, k_key)->record->host == "host-b");
}

TEST_CASE("an S3 lease whose object was removed is lost at its next renewal, and left to the next holder",
          "[s3][lease]") {
  auto s3 = test::fresh_bucket("removed");
  auto a = S3Lease::acquire(*s3, k_key, 60s, "partitioned-host");
  REQUIRE(a.has_value());
  // Taken over and given back meanwhile, as a holder does once its entry is settled.
  REQUIRE(s3->remove(k_key));
  auto lost = a->renew();
  REQUIRE_FALSE(lost.has_value());
  CHECK(lost.error().code == Errc::precondition_failed);
  CHECK_THAT(lost.error().message, ContainsSubstring("lease lost"));
  CHECK(a->lost());
  auto b = S3Lease::acquire(*s3, k_key, 60s, "host-b");
  REQUIRE(b.has_value());
  a->finish(S3Lease::Entry::settled);  // not a's to remove
  CHECK(read_lease(*s3, k_key)->record->host == "host-b");
}

TEST_CASE("an S3 lease renewed in time is never taken over", "[s3][lease]") {
  auto s3 = test::fresh_bucket("renewed");
  auto a = S3Lease::acquire(*s3, k_key, 2s, "host-a");
  REQUIRE(a.has_value());
  std::atomic<bool> stop{false};
  std::atomic<int> renewals{0}, renew_failures{0};
  std::thread holder([&] {
    while (!stop) {
      std::this_thread::sleep_for(500ms);
      if (a->renew()) ++renewals;
      else ++renew_failures;
    }
  });
  int tries = 0, won = 0;
  for (auto end = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < end; ++tries) {
    auto b = S3Lease::acquire(*s3, k_key, 2s, "host-b");
    if (b) ++won;
    std::this_thread::sleep_for(50ms);
  }
  stop = true;
  holder.join();
  CHECK(won == 0);
  CHECK(tries > 20);
  CHECK(renewals >= 8);
  CHECK(renew_failures == 0);
}

TEST_CASE("of many contenders for a free or expired S3 lease exactly one wins", "[s3][lease]") {
  auto s3 = test::fresh_bucket("race");
  auto contend = [&](const std::string& key) {
    std::atomic<int> winners{0}, busy{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i)
      threads.emplace_back([&, i] {
        auto r = S3Lease::acquire(*s3, key, 60s, fmt::format("host-{}", i));
        if (r) ++winners;
        else if (r.error().code == Errc::busy) ++busy;
      });
    for (auto& t : threads) t.join();
    CHECK(winners == 1);
    CHECK(busy == 7);
  };
  for (int round = 0; round < 5; ++round) {
    std::string key = fmt::format("e{}/model.hlo_module.pb.lock", round);
    contend(key);  // nobody holds it yet: If-None-Match decides
    auto holder = read_lease(*s3, key);
    REQUIRE(holder.has_value());
    // Mark it released as its holder would: now If-Match decides among the takers.
    auto rec = *holder->record;
    rec.released = true;
    ++rec.seq;
    REQUIRE(s3->put(key, detail::lease_json(rec), {.if_match = holder->etag}).has_value());
    contend(key);
  }
}

TEST_CASE("a lock object that is not a lease holds until the default ttl", "[s3][lease]") {
  auto s3 = test::fresh_bucket("foreign");
  REQUIRE(s3->put(k_key, "").has_value());  // as an existence-only lock of another tool
  auto r = S3Lease::acquire(*s3, k_key, 60s, "host-a");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::busy);
  CHECK_THAT(r.error().message, ContainsSubstring("not ours"));
}

TEST_CASE("a lease record with a number out of range is not a lease", "[s3][lease]") {
  auto record = [](std::string_view pid, std::string_view ttl, std::string_view seq) {
    return fmt::format(R"({{"neffcache_lease":1,"host":"h","pid":{},"instance":"i","ttl_seconds":{},"released":false,"seq":{}}})",
                       pid, ttl, seq);
  };
  auto good = detail::parse_lease(record("12", "60", "3"));
  REQUIRE(good.has_value());
  CHECK(good->pid == 12);
  CHECK(good->ttl == 60s);
  CHECK(good->seq == 3);
  // A number beyond 64 bits parses as a float (the fuzzer's find): refused, not converted.
  CHECK_FALSE(detail::parse_lease(record(std::string(89, '4'), "60", "3")).has_value());
  CHECK_FALSE(detail::parse_lease(record("12", "60.5", "3")).has_value());
  CHECK_FALSE(detail::parse_lease(record("12", "60", "1e30")).has_value());
  // A ttl outside 0 s to a day.
  CHECK_FALSE(detail::parse_lease(record("12", "-5", "3")).has_value());
  CHECK_FALSE(detail::parse_lease(record("12", "86401", "3")).has_value());
  CHECK(detail::parse_lease(record("12", "86400", "3")).has_value());
}

TEST_CASE("the lease a tier holds for a client that compiles an entry itself is renewed without any look at it",
          "[s3][lease]") {
  auto s3 = test::fresh_bucket("standin");
  test::TempDir local;
  const std::string rel = test::fake_entry(0, 3100);
  const std::string entry_dir = (local / rel).string();
  fs::create_directories(entry_dir);
  test::spit(fs::path(entry_dir) / "compile_flags.json", R"(["--target=trn1"])");
  test::spit(fs::path(entry_dir) / "model.hlo_module.pb", test::slurp(test::corpus_files()[0]));
  // The client's lock, as torch-xla takes it to compile the entry itself.
  auto files = read_entry_files(entry_dir);
  REQUIRE(files.has_value());
  auto client = EntryLock::try_acquire_entry(entry_dir, *files);
  REQUIRE(client.has_value());

  auto url = parse_cache_url(fmt::format("s3://{}", s3->bucket()));
  auto tier_client = S3Client::open(*url, test::S3Env{}.lookup());
  REQUIRE(tier_client.has_value());
  S3Tier::Options o;
  o.root = local.path().string();
  o.compile.lease_ttl = 2s;
  S3Tier tier(std::move(*tier_client), o);
  CompileSettings s;
  s.compiler = *CompilerTemplate::parse(test::k_fake_template);
  // One look: busy, and the tier now holds the entry's lease for the client.
  CHECK(tier.settle(entry_dir, s).outcome == CompileOutcome::busy);
  const std::string key = rel + "/model.hlo_module.pb.lock";
  REQUIRE(read_lease(*s3, key).has_value());
  // No look again for 2.5 ttls (every scheduler worker busy with long compiles): another
  // host still finds the lease live and waits.
  std::this_thread::sleep_for(5s);
  auto lease = read_lease(*s3, key);
  REQUIRE(lease.has_value());
  CHECK_FALSE(lease->expired);
  auto other = S3Lease::acquire(*s3, key, 2s, "host-b");
  REQUIRE_FALSE(other.has_value());
  CHECK(other.error().code == Errc::busy);
}

TEST_CASE("a renewal whose answer was lost, retried, keeps the lease", "[s3][lease][faults]") {
  auto direct = test::fresh_bucket("renew-lost-answer");
  // The acquire passes; the renewal reaches the server, its answer is lost, and the
  // client tries again with the ETag the server no longer has.
  test::FaultyProxy proxy("lose-answer", 1);
  auto s3 = proxy.client(direct->bucket());
  auto a = S3Lease::acquire(*s3, k_key, 60s, "host-a");
  REQUIRE(a.has_value());
  auto renewed = a->renew();
  INFO((renewed ? "" : renewed.error().message));
  CHECK(renewed.has_value());
  CHECK_FALSE(a->lost());
  CHECK(s3->retries() >= 1);
  // Still ours: the next renewal holds, and another host waits.
  CHECK(a->renew().has_value());
  auto b = S3Lease::acquire(*direct, k_key, 60s, "host-b");
  REQUIRE_FALSE(b.has_value());
  CHECK(b.error().code == Errc::busy);
  CHECK(a->release().has_value());
  CHECK(S3Lease::acquire(*direct, k_key, 60s, "host-b").has_value());
}

TEST_CASE("a second lease held for one client's entry is given back, not dropped", "[s3][lease]") {
  auto s3 = test::fresh_bucket("standin-put");
  // Two leases of one entry under the two names its HLO may have (taken at two looks,
  // before and after the bucket had its HLO).
  const std::string first = "neuronxcc-2.15/MODULE_1+abc/model.hlo_module.pb.lock";
  const std::string second = "neuronxcc-2.15/MODULE_1+abc/model.hlo.pb.lock";
  auto a = S3Lease::acquire(*s3, first, 60s, "host-a");
  auto b = S3Lease::acquire(*s3, second, 60s, "host-a");
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  {
    detail::StandIns held;
    held.put("/tier/entry", detail::StandIns::Held(std::move(*a)));
    held.put("/tier/entry", detail::StandIns::Held(std::move(*b)));
    CHECK(held.live("/tier/entry") == std::optional<bool>(true));
    // The one held first stays, the other is free at once (not after its ttl).
    auto other = S3Lease::acquire(*s3, first, 60s, "host-b");
    CHECK_FALSE(other.has_value());
    CHECK(S3Lease::acquire(*s3, second, 60s, "host-b").has_value());
  }
  // The one kept is given back with the rest when the tier goes.
  CHECK(S3Lease::acquire(*s3, first, 60s, "host-b").has_value());
}

TEST_CASE("a renewal that timed out after it reached the server leaves the lease held, not lost",
          "[s3][lease][faults]") {
  auto direct = test::fresh_bucket("renew-timed-out");
  // No retries: the renewal's answer never comes, and it fails; the server has it.
  test::FaultyProxy proxy("lose-answer", 1);
  auto s3 = proxy.client(direct->bucket(), /*attempts=*/1);
  auto a = S3Lease::acquire(*s3, k_key, 60s, "host-a");
  REQUIRE(a.has_value());
  auto failed = a->renew();
  REQUIRE_FALSE(failed.has_value());
  CHECK(failed.error().code != Errc::precondition_failed);
  CHECK_FALSE(a->lost());
  // The next renewal meets the ETag that write made: the lease holds our instance, so it
  // is ours, and renewed.
  auto renewed = a->renew();
  INFO((renewed ? "" : renewed.error().message));
  CHECK(renewed.has_value());
  CHECK_FALSE(a->lost());
  CHECK(a->renew().has_value());
  CHECK_FALSE(S3Lease::acquire(*direct, k_key, 60s, "host-b").has_value());
}

TEST_CASE("a warm start places nothing before its sync, then each entry whole with its marker last", "[s3][warm]") {
  auto s3 = test::fresh_bucket("warm-steps");
  const std::string done = test::fake_entry(0, 3300), pending = test::fake_entry(1, 3300);
  for (const auto& rel : {done, pending}) {
    REQUIRE(s3->put(rel + "/compile_flags.json", R"(["--target=trn1"])"));
    REQUIRE(s3->put(rel + "/model.hlo_module.pb", test::slurp(test::corpus_files()[0])));
  }
  REQUIRE(s3->put(done + "/model.neff", std::string(3u << 20, 'N')));
  REQUIRE(s3->put(done + "/model.done", ""));
  test::TempDir local;
  auto url = parse_cache_url(fmt::format("s3://{}", s3->bucket()));
  auto client = S3Client::open(*url, test::S3Env{}.lookup());
  REQUIRE(client.has_value());
  S3Tier::Options o;
  o.root = local.path().string();
  S3Tier tier(std::move(*client), o);

  auto got = tier.warm(done);
  REQUIRE(got.has_value());
  CHECK(*got == 3u << 20);
  CHECK(tier.warm(pending).error().code == Errc::not_found);
  // Fetched, not yet synced: what a crash now would leave is no entry at all.
  CHECK_FALSE(fs::exists(local / done));
  auto placed = tier.warmed();
  REQUIRE(placed.has_value());
  CHECK(*placed == 1);
  auto files = read_entry_files((local / done).string());
  REQUIRE(files.has_value());
  CHECK(files->done());
  CHECK(fs::file_size(local / done / "model.neff") == 3u << 20);
  CHECK(fs::exists(local / done / "model.hlo_module.pb"));
  CHECK_FALSE(fs::exists(local / pending));
  // The staging area is empty again, and a second warm finds the entry here.
  for (const auto& e : fs::recursive_directory_iterator(local.path() / ".neffcache"))
    CHECK_FALSE(e.path().filename().string().starts_with("warm-"));
  CHECK(tier.warm(done).value() == 0);
  CHECK(tier.warmed().value() == 0);
}
