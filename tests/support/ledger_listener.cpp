// Each test process gets a memory ledger of its own (NEFFCACHE_MEM_LEDGER, inherited by
// the tools and daemons it starts), so that tests run side by side by ctest never wait
// for each other's compile reservations; within a test, its processes share one ledger
// as processes on a host do. A test that sets NEFFCACHE_MEM_LEDGER itself keeps its own.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <catch2/catch_test_case_info.hpp>
#include <catch2/reporters/catch_reporter_event_listener.hpp>
#include <catch2/reporters/catch_reporter_registrars.hpp>

namespace {

class LedgerPerProcess : public Catch::EventListenerBase {
 public:
  using Catch::EventListenerBase::EventListenerBase;

  void testRunStarting(Catch::TestRunInfo const&) override {
    if (std::getenv("NEFFCACHE_MEM_LEDGER")) return;
    std::string tmpl = (std::filesystem::temp_directory_path() / "neffcache-test-ledger-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) return;
    dir_ = tmpl;
    ::setenv("NEFFCACHE_MEM_LEDGER", dir_.c_str(), 1);
  }

  void testRunEnded(Catch::TestRunStats const&) override {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::string dir_;
};

}  // namespace

CATCH_REGISTER_LISTENER(LedgerPerProcess)
