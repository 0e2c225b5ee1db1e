// neffcache explain HLO|ENTRY: would this graph hit in the cache, and if not, why.
#include "neffcache/cmd_explain.hpp"

#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/index.hpp>
#include <neffcache/hlo/diff.hpp>

#include "neffcache/common.hpp"
#include "neffcache/explain_nearest.hpp"

namespace neffcache::cli {
namespace {

namespace fs = std::filesystem;

// The graph asked about, read, and the entry a client would use for it.
struct Asked {
  AskedGraph graph;
  std::string target;  // neuronxcc-*/MODULE_*: the entry named, else the graph's key
  std::vector<std::string> default_flags;  // for entries without compile_flags.json
};

// Reads the input: an entry of the cache (a folder, or a file in one) or an HLO file.
Result<Asked> read_asked(const ExplainOptions& opts, const store::Store& cache) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(opts.input, ec);
  std::optional<store::Entry> entry;
  if (auto named = cache.named(opts.input)) entry = *named;
  else if (is_dir) return named.error();
  // An LNL key (an MD5 of what LNL traced) cannot be made from a graph: the entry asked
  // about is the entry named, and its compiler version is the one its result records,
  // else the compiler's that would compile it (as for its content identity, index.hpp).
  const bool lnl = entry && entry->dialect() == Dialect::lnl;

  auto env_flags = compiler_flags({});
  if (!env_flags) return env_flags.error();
  Asked a;
  a.default_flags = env_flags->compiler_flags;
  std::string bytes, version = opts.compiler_version;
  std::optional<std::vector<std::string>> flags;
  if (!opts.flags.empty()) {
    auto given = compiler_flags(opts.flags);
    if (!given) return given.error();
    flags = std::move(given->compiler_flags);
  }
  if (entry) {
    auto files = cache.files(*entry);
    if (!files) return files.error();
    if (!files->has_hlo()) return Error{Errc::not_found, fmt::format("{}: no HLO file in this entry", entry->view())};
    auto hlo = cache.local_file(*entry, *files->hlo_name());
    if (!hlo) return hlo.error();
    auto read = detail::read_file(hlo->path());
    if (!read) return read.error();
    bytes = std::move(*read);
    // (A directory cache's entry: the local file is in the entry's folder.)
    const std::string entry_dir = fs::path(hlo->path()).parent_path().string();
    if (!flags && lnl) {
      auto entry_flags = entry_compiler_flags(entry_dir, *files, a.default_flags);
      if (!entry_flags) return entry_flags.error();
      flags = std::move(*entry_flags);
    }
    if (!flags) {
      // (Through the store, which may give a downloaded copy of the file.)
      std::optional<store::LocalFile> json;
      if (files->has(EntryFile::flags)) {
        auto local = cache.local_file(*entry, k_compile_flags_file);
        if (!local) return local.error();
        json.emplace(std::move(*local));
      }
      auto entry_flags = neuron_compiler_flags(json ? std::optional(json->path()) : std::nullopt, a.default_flags);
      if (!entry_flags) return entry_flags.error();
      flags = std::move(*entry_flags);
    }
    if (version.empty() && lnl) {
      if (files->done() || files->failed()) {
        auto recorded = detail::recorded_compiler_version(entry_dir);
        if (!recorded)
          return Error{Errc::invalid_argument,
                       fmt::format("{}: its client compiled it, and nothing says with which compiler version: it has "
                                   "no content identity (pass --compiler-version to compare it anyway)",
                                   entry->view())};
        version = std::move(*recorded);
      } else {
        auto v = compiler_version({}, opts.compiler);
        if (!v) return v.error();
        version = std::move(*v);
      }
    }
    if (version.empty()) version = entry->compiler_dir().substr(k_compiler_dir_prefix.size());
  } else {
    auto read = detail::read_file(opts.input);
    if (!read) return read.error();
    bytes = std::move(*read);
    auto v = compiler_version(opts.compiler_version, opts.compiler);
    if (!v) return v.error();
    version = std::move(*v);
  }
  if (!flags) flags = a.default_flags;
  if (auto v = check_compiler_version(version); !v) return v.error();

  auto split = split_hlo(bytes);
  if (!split) return Error{split.error().code, fmt::format("{}: {}", opts.input, split.error().message)};
  const EntryKey key{version, split->analysis.graph_hash, flags_hash(*flags)};
  a.graph.id = ContentId{key.compiler_dir(), split->analysis.canonical_sha256, key.flags_hash};
  a.graph.flags = std::move(*flags);
  a.graph.hlo_bytes = bytes.size();
  a.graph.units = std::move(split->units);
  // The entry named is the one asked about, unless --flag or --compiler-version move it
  // (an LNL entry stays: no key of its dialect can be made from a graph).
  a.target = entry && (lnl || (opts.flags.empty() && opts.compiler_version.empty())) ? entry->path()
                                                                                     : key.relative_path();
  return a;
}

std::string shown_flags(const std::vector<std::string>& flags) {
  return flags.empty() ? std::string("none") : fmt::format("{}", fmt::join(flags, " "));
}

nlohmann::ordered_json nearest_json(const Nearest& n, const store::Store& cache) {
  nlohmann::ordered_json j{{"entry", cache.view(*cache.at(n.entry))},
                           {"state", n.failed ? "failed" : "done"},
                           {"differs", to_string(n.differs)},
                           {"compiler", n.compiler_dir},
                           {"flags_added", n.flags_added},
                           {"flags_removed", n.flags_removed}};
  if (n.differs == Nearest::Differs::graph) {
    j["instructions"] = {{"added", n.diff.of_instructions ? n.diff.added : 0},
                         {"removed", n.diff.of_instructions ? n.diff.removed : 0},
                         {"changed", n.diff.of_instructions ? n.diff.changed : 0}};
    if (!n.diff.of_instructions) j["other_fields_changed"] = n.diff.added + n.diff.removed + n.diff.changed;
    j["first_difference"] = {{"cached", n.diff.first_cached}, {"asked", n.diff.first_asked}};
  }
  return j;
}

void print_nearest(const Nearest& n, const Asked& a, const store::Store& cache) {
  fmt::print("  {} ({})\n", cache.view(*cache.at(n.entry)), n.failed ? "failed" : "done");
  switch (n.differs) {
    case Nearest::Differs::nothing:
      fmt::print("    same graph and flags, but the content index does not know it yet: `neffcache index` records it, "
                 "and a daemon does at its next start\n");
      break;
    case Nearest::Differs::compiler:
      fmt::print("    same graph, compiled by another compiler: {} (asked: {})\n", n.compiler_dir,
                 a.graph.id.compiler_dir);
      if (n.flags_added.empty() && n.flags_removed.empty()) break;
      [[fallthrough]];
    case Nearest::Differs::flags:
      if (n.flags_added.empty() && n.flags_removed.empty())
        fmt::print("    same graph, other flags: the same flags in another order\n");
      else
        fmt::print("    same graph, other flags: added {}; removed {}\n", shown_flags(n.flags_added),
                   shown_flags(n.flags_removed));
      break;
    case Nearest::Differs::graph:
      if (n.diff.of_instructions)
        fmt::print("    graph differs: {} instructions added, {} removed, {} changed\n", n.diff.added, n.diff.removed,
                   n.diff.changed);
      else
        fmt::print("    graph differs: same instructions, {} other fields differ\n",
                   n.diff.added + n.diff.removed + n.diff.changed);
      fmt::print("      cached: {}\n      asked:  {}\n",
                 n.diff.first_cached.empty() ? "(nothing)" : n.diff.first_cached,
                 n.diff.first_asked.empty() ? "(nothing)" : n.diff.first_asked);
      break;
  }
}

}  // namespace

void setup_explain(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(app, exit_code, "explain",
                                       "Say whether a graph would hit in the cache, and if not, how it differs from "
                                       "the nearest cached graphs",
                                       run_explain);
  sub->add_option("HLO|ENTRY", opts->input,
                  "serialized HloModuleProto or HloProto, or an entry of the cache (a MODULE_* "
                  "folder, an LNL entry's key folder, or a file in one)")
      ->required();
  sub->add_option("--flag", opts->flags,
                  "a compiler flag (repeat; write --flag=-O1 for flags that start with -); default: the entry's "
                  "compile_flags.json, else the compiler flags in NEURON_CC_FLAGS")
      ->allow_extra_args(false);
  sub->add_option("--compiler-version", opts->compiler_version,
                  "compiler version; default: the entry's compiler folder (an LNL entry: the version its result "
                  "records), else asks '<compiler> --version'");
  sub->add_option("--compiler", opts->compiler, "compiler to ask for its version")->capture_default_str();
  sub->add_flag("--json", opts->json, "print one JSON object");
}

int run_explain(const ExplainOptions& opts) {
  auto url = opts.cache.empty() ? resolve_cache_url() : parse_cache_url(opts.cache);
  if (!url) return report(url.error());
  auto cache = store::open_store(*url);
  if (!cache) return report(cache.error());
  // (The nearest graphs are looked for in a directory cache's index only: a bucket's
  // would cost a download of every graph compared.)
  const ContentIndex* index = (*cache)->content_index();
  auto asked = read_asked(opts, **cache);
  if (!asked) return report(asked.error());
  const store::Store& c = **cache;
  const auto& id = asked->graph.id;
  const std::string target_view = c.view(*c.at(asked->target));

  // The verdict, in the order a client meets them: its entry, a twin, a recorded failure.
  std::string verdict = "miss";
  std::optional<IndexRecord> twin;
  auto files = c.files(*c.at(asked->target));
  if (files && files->done()) {
    verdict = "hit";
  } else if (files && files->failed()) {
    verdict = "failure";
    twin.emplace();
    twin->entry = asked->target;
    twin->failed = true;
  } else if (auto t = c.find_twin(id, asked->target, /*with_failures=*/false, asked->default_flags)) {
    verdict = "twin";
    twin = std::move(t);
  } else if (auto f = c.find_twin(id, asked->target, /*with_failures=*/true, asked->default_flags)) {
    verdict = "failure";
    twin = std::move(f);
  }
  std::vector<Nearest> nearest;
  if (verdict == "miss" && index)
    nearest = nearest_entries(*index, asked->graph, asked->target, asked->default_flags);

  const std::string twin_view = twin ? c.view(*c.at(twin->entry)) : std::string();
  // Where the failure record of `entry` is, for people: its model.log; an LNL entry's is
  // ours, outside its folder (own_files), in a bucket inside it.
  auto failure_shown = [&](const std::string& entry) {
    const EntryFiles files = EntryFiles::of_entry_path(entry);
    if (!files.is_lnl() || !c.folder()) return fmt::format("its {}", files.failure_name());
    return fmt::format("{} in the cache's folder", own_files(entry).failure);
  };
  if (opts.json) {
    nlohmann::ordered_json j{{"verdict", verdict}, {"identity", id.str()}, {"entry", target_view}, {"twin", nullptr}};
    if (twin)
      j["twin"] = {{"entry", twin_view}, {"result", twin->failed ? "failure" : "neff"},
                   {"compile_seconds", twin->compile_seconds}};
    j["nearest"] = nlohmann::ordered_json::array();
    for (const auto& n : nearest) j["nearest"].push_back(nearest_json(n, c));
    fmt::print("{}\n", j.dump(2));
    return k_exit_ok;
  }
  if (verdict == "hit") {
    fmt::print("hit: {} is compiled\n", target_view);
  } else if (verdict == "twin") {
    fmt::print("twin: {} is not compiled, but {} holds the same graph and flags: its NEFF is reused, which saves "
               "{:.1f} s of compiling\n",
               target_view, twin_view, twin->compile_seconds);
  } else if (verdict == "failure" && twin->entry == asked->target) {
    fmt::print("failure: {} failed to compile (see {})\n", target_view, failure_shown(twin->entry));
  } else if (verdict == "failure") {
    fmt::print("failure: would fail: same graph as {}, which failed (see {})\n", twin_view,
               failure_shown(twin->entry));
  } else {
    fmt::print("miss: {} is not compiled, and no entry holds the same graph and flags\n", target_view);
  }
  fmt::print("identity: {}\n", id.str());
  if (verdict != "miss") return k_exit_ok;
  if (!index) fmt::print("nearest cached graphs: not looked for in a bucket\n");
  else if (nearest.empty()) fmt::print("no cached graph to compare with\n");
  else fmt::print("nearest cached graphs:\n");
  for (const auto& n : nearest) print_nearest(n, *asked, c);
  return k_exit_ok;
}

}  // namespace neffcache::cli
