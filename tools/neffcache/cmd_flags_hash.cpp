// neffcache flags-hash [--legacy] [--] FLAG...: the +xxxxxxxx suffix of MODULE_ names.
#include "neffcache/cmd_flags_hash.hpp"

#include <fmt/format.h>
#include <neffcache/cache/flags.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_flags_hash(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_command(app, exit_code, "flags-hash",
                                 "Print the flags hash (8 hex digits) of compiler flags; put flags after --. "
                                 "Cache-wrapper options (--cache_dir, --retry_failed_compilation, ...) are left out first.",
                                 run_flags_hash);
  sub->add_flag("--legacy", opts->legacy,
                "hash the space-joined form of older compiler releases instead of the JSON list");
  sub->add_option("flags", opts->flags, "compiler flags, e.g. -- --target=trn1 -O1");
}

int run_flags_hash(const FlagsHashOptions& opts) {
  auto parsed = separate_wrapper_options(opts.flags);
  if (!parsed) return report(parsed.error());
  fmt::print("{}\n", flags_hash(parsed->compiler_flags,
                                opts.legacy ? FlagsHashForm::legacy : FlagsHashForm::json));
  return k_exit_ok;
}

}  // namespace neffcache::cli
