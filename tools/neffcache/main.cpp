// neffcache: administration of a Neuron compile cache. main only wires subcommands.
#include <CLI/CLI.hpp>

#include "neffcache/cmd_analyze.hpp"
#include "neffcache/cmd_bundle.hpp"
#include "neffcache/cmd_clean.hpp"
#include "neffcache/cmd_clear.hpp"
#include "neffcache/cmd_compile.hpp"
#include "neffcache/cmd_explain.hpp"
#include "neffcache/cmd_flags_hash.hpp"
#include "neffcache/cmd_gc.hpp"
#include "neffcache/cmd_hlo_stats.hpp"
#include "neffcache/cmd_index.hpp"
#include "neffcache/cmd_key.hpp"
#include "neffcache/cmd_ls.hpp"
#include "neffcache/cmd_manifest.hpp"
#include "neffcache/cmd_put.hpp"
#include "neffcache/cmd_retry.hpp"
#include "neffcache/cmd_scan.hpp"
#include "neffcache/cmd_stats.hpp"
#include "neffcache/cmd_sync.hpp"
#include "neffcache/cmd_verify.hpp"
#include "neffcache/cmd_warm.hpp"
#include "common/version.hpp"
#include "neffcache/common.hpp"

int main(int argc, char** argv) {
  using namespace neffcache::cli;
  CLI::App app{"neffcache: keys, statistics and administration of a Neuron compile cache"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("neffcache ") + neffcache::program_version(), "print the version and exit");
  int exit_code = k_exit_ok;
  setup_flags_hash(app, exit_code);
  setup_key(app, exit_code);
  setup_hlo_stats(app, exit_code);
  setup_put(app, exit_code);
  setup_ls(app, exit_code);
  setup_scan(app, exit_code);
  setup_compile(app, exit_code);
  setup_retry(app, exit_code);
  setup_clear_locks(app, exit_code);
  setup_clean(app, exit_code);
  setup_clear_neffs(app, exit_code);
  setup_gc(app, exit_code);
  setup_verify(app, exit_code);
  setup_stats(app, exit_code);
  setup_analyze(app, exit_code);
  setup_explain(app, exit_code);
  setup_sync(app, exit_code);
  setup_index(app, exit_code);
  setup_manifest(app, exit_code);
  setup_warm(app, exit_code);
  setup_bundle(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? k_exit_ok : k_exit_usage;
  }
  return exit_code;
}
