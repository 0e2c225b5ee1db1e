// neffcache compile [ENTRY...]: compile every entry that needs it (or the ones named) in
// parallel, with the Neuron tool's progress line, report and exit status. On a
// neffcachefs mount it asks the daemon instead, by opening the pending NEFFs.
#include "neffcache/cmd_compile.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <neffcache/compile/batch.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/store/scheduling.hpp>

#include "common/progress.hpp"
#include "neffcache/common.hpp"

namespace neffcache::cli {

namespace {

volatile std::sig_atomic_t g_stop = 0;  // SIGINT or SIGTERM arrived

constexpr std::chrono::milliseconds k_tick{250};
constexpr std::size_t k_max_mount_openers = 64;

// An entry a run takes, as its batch names it (Store::view: its folder or URL), and
// when it is taken.
struct Target {
  std::string entry;
  Priority priority = Priority::background;
  auto operator<=>(const Target&) const = default;
};

// Entries named on the command line, each once, in order of their names.
void sort_unique(std::vector<Target>& targets) {
  std::sort(targets.begin(), targets.end());
  targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
}

// Compiles here, through the library's scheduler.
std::vector<Batch::Item> compile_here(const std::vector<Target>& targets, Scheduler::Options so,
                                      const std::vector<std::string>& default_flags) {
  Batch batch(std::move(so), default_flags);
  tools::ProgressDisplay display;
  for (const auto& t : targets) batch.add(t.entry, t.priority);
  while (!batch.wait_until(std::chrono::steady_clock::now() + k_tick)) {
    if (g_stop) batch.shutdown();  // running compiles stop as transient failures
    display.update(batch.counts());
  }
  display.finish(batch.counts());
  return batch.items();
}

// Asks a neffcachefs daemon: opening a pending NEFF (model.neff; LNL: graph_<key>.neff)
// makes it compile (or join the compile), and the open returns when the compile ends.
std::vector<Batch::Item> ask_daemon(const std::vector<Target>& targets) {
  // Shared with the openers: after a stop they may still be blocked in open().
  struct State {
    std::vector<Batch::Item> items;
    std::vector<std::string> neffs;  // what to open, by item
    std::atomic<std::size_t> next{0}, done{0}, failed{0};
  };
  auto st = std::make_shared<State>();
  for (const auto& [t, priority] : targets) {
    auto files = read_entry_files(t);
    std::string_view hlo = files && files->hlo_name() ? *files->hlo_name() : k_hlo_module_file;
    st->items.push_back({t, fmt::format("{}/{}", t, hlo), {}});
    st->neffs.push_back(fmt::format("{}/{}", t, files ? files->neff_name() : std::string(k_neff_file)));
  }
  auto opener = [st] {
    for (std::size_t i; !g_stop && (i = st->next++) < st->items.size();) {
      auto& item = st->items[i];
      auto t0 = std::chrono::steady_clock::now();
      int fd = ::open(st->neffs[i].c_str(), O_RDONLY | O_CLOEXEC);
      int err = errno;
      CompileResult r;
      r.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.attempts = 1;
      r.outcome = fd >= 0 ? CompileOutcome::success : CompileOutcome::failed;
      if (fd < 0) r.message = std::strerror(err);
      else ::close(fd);
      item.result = r;
      ++(fd >= 0 ? st->done : st->failed);
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < std::min(st->items.size(), k_max_mount_openers); ++i) threads.emplace_back(opener);
  tools::ProgressDisplay display;
  auto counts = [&] {
    Batch::Counts c;
    c.total = st->items.size();
    c.done = st->done;
    c.failed = st->failed;
    c.remaining = c.total - c.done - c.failed;
    return c;
  };
  while (st->done + st->failed < st->items.size() && !g_stop) {
    display.update(counts());
    std::this_thread::sleep_for(k_tick);
  }
  display.finish(counts());
  // After a stop, openers still blocked in the kernel are left to the daemon.
  for (auto& t : threads) g_stop ? t.detach() : t.join();
  if (g_stop) return {};
  return st->items;
}

// Whether a run compiles an entry in state `s`: pending, partial, stale-locked; failed
// with `retry_failed`.
bool needs_compile(EntryState s, bool retry_failed) {
  return s == EntryState::pending || s == EntryState::partial || s == EntryState::stale_lock ||
         (s == EntryState::failed && retry_failed);
}

// The entries of a listing a run takes, by their path in the cache, sorted: those that
// need a compile (pending, partial, stale-locked; failed ones with `retry_failed`) and those
// compiling elsewhere (waited for, so the report covers them), within `share` when given
// (which sees every entry listed, whatever its state, so that nodes agree on it).
std::vector<Target> pick(const store::Store& cache, const std::vector<EntryInfo>& entries, bool retry_failed,
                         const SharePlan& share) {
  std::vector<const EntryInfo*> graphs;
  for (const auto& e : entries) graphs.push_back(&e);
  std::sort(graphs.begin(), graphs.end(), [](const auto* a, const auto* b) { return a->path < b->path; });
  std::vector<std::optional<Priority>> shares(graphs.size(), Priority::background);
  if (share) {
    std::vector<std::string> paths;
    for (const auto* e : graphs) paths.push_back(e->path);
    shares = share(paths);
  }
  std::vector<Target> picked;
  for (std::size_t i = 0; i < graphs.size(); ++i) {
    const auto s = graphs[i]->state;
    const bool wanted = needs_compile(s, retry_failed) || s == EntryState::compiling;
    if (wanted && shares[i]) picked.push_back({cache.entry(*graphs[i]).view(), *shares[i]});
  }
  return picked;
}

}  // namespace

Result<Scheduler::Options> scheduler_options(const CompileOptions& opts, const ParsedFlags& env, bool need_compiler) {
  Scheduler::Options so;
  // Entries of a directory cache: the folder's files say whether one is settled.
  // (run_compile_s3 replaces this and the compile with the S3 cache's own.)
  so.settled = folder_settled;
  so.settings.log = [](std::string_view line) {
    if (tools::logs(tools::LogLevel::warning)) fmt::print(stderr, "neffcache: {}\n", line);
  };
  auto ledger = open_memory_ledger(opts.mem_budget, opts.mem_ledger, program_invocation_short_name, so.settings.log);
  if (!ledger) return ledger.error();
  so.memory = std::move(*ledger);
  auto tmpl = compiler_option(opts.compiler, need_compiler ? Installed::required : Installed::not_required);
  if (!tmpl) return tmpl.error();
  so.settings.compiler = *tmpl;
  if (opts.jobs < 0) return Error{Errc::invalid_argument, "--jobs must be positive"};
  so.jobs = opts.jobs > 0 ? opts.jobs : default_jobs();
  auto retries = retries_option(opts.retries, process_env);
  if (!retries) return retries.error();
  so.settings.max_retries = *retries;
  so.settings.retry_failed = opts.retry_failed || env.wrapper.retry_failed_compilation;
  so.settings.default_flags = env.compiler_flags;
  if (opts.compile_timeout < 0) return Error{Errc::invalid_argument, "--compile-timeout must be positive"};
  if (opts.compile_timeout > 0)
    so.settings.timeout = std::chrono::milliseconds(static_cast<int64_t>(opts.compile_timeout * 1000));
  return so;
}

void add_memory_options(CLI::App* app, std::string& budget, std::string& ledger) {
  app->add_option("--mem-budget", budget,
                  fmt::format("host memory that compiles may reserve, shared by every neffcache process on the host: "
                              "a size (48GiB), a share of the memory this process may use (70%), or off (admit by "
                              "--jobs only) (default: NEFFCACHE_MEM_BUDGET, else {:.0f}% of the smaller of RAM and "
                              "this process's cgroup limit)",
                              k_default_budget_share * 100));
  app->add_option("--mem-ledger", ledger,
                  fmt::format("the folder of the host's memory reservations (default: NEFFCACHE_MEM_LEDGER, else {})",
                              k_default_ledger_dir));
}

void setup_compile(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_command(app, exit_code, "compile",
                                 "Compile every entry that needs it (pending, partial, stale-locked; failed ones "
                                 "with --retry-failed), of either dialect (Neuron, LNL), or the entries named, in parallel; exit status = number of "
                                 "failed graphs",
                                 run_compile);
  sub->add_option("ENTRY", opts->entries, "entry folders (MODULE_*, or an LNL entry's 32-hex key folder), or files in them; paths or relative to "
                  "the cache");
  add_cache_option(sub, opts->cache);
  sub->add_option("-j,--jobs", opts->jobs, "compiles at once (default: min(cores, ceil(RAM / 64 GiB)))");
  sub->add_option("--retries", opts->retries,
                  "retries of transient failures (default: NEURON_PARALLEL_COMPILE_MAX_RETRIES or 0)");
  sub->add_flag("--retry-failed", opts->retry_failed,
                "compile entries with a recorded failure again (also on with --retry_failed_compilation in "
                "NEURON_CC_FLAGS)");
  sub->add_option("--compiler", opts->compiler,
                  fmt::format("compiler command template (default: {})", k_default_compiler_template));
  sub->add_option("--compile-timeout", opts->compile_timeout,
                  fmt::format("seconds before a compile is stopped (default: {})", k_default_compile_timeout.count()));
  add_memory_options(sub, opts->mem_budget, opts->mem_ledger);
  auto* json = sub->add_flag("--json", opts->json, "print only the JSON report");
  auto* watch = sub->add_flag("--watch", opts->watch,
                "a compile farm: list the cache every --watch-interval seconds and compile every entry that needs it "
                "as it appears, largest first, until SIGTERM or SIGINT (which stop the running compiles and give "
                "their entries back); one line per result");
  watch->excludes(json);  // (a farm has no end-of-run report: one line per result)
  sub->add_option("--watch-interval", opts->watch_interval, "seconds between listings with --watch")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0))
      ->needs(watch);
}

namespace {

// neffcache compile --watch: a compile farm. Lists the cache every `interval`; every entry
// that needs a compile and was not taken yet goes to one scheduler for the process's life,
// the largest graphs first (EntryInfo::bytes), each compiled under its lock or lease, so
// that several farm processes (and any other compiler) share the work exactly once. An
// entry another process compiles is not taken (its holder publishes it; a lease that
// lapses makes it stale, and it is taken then). Prints a line per result; SIGTERM or
// SIGINT stop it: running compiles are stopped and their entries given back.
int run_watch(const CompileOptions& opts, store::Store& cache, Scheduler::Options so,
              const std::vector<std::string>& default_flags, bool retry_failed) {
  if (!so.settings.compiler_version) so.settings.compiler_version = compiler_version(so.settings);
  store::compile_through(cache, so);
  Batch batch(std::move(so), default_flags);
  std::map<std::string, std::string> working;  // entry view -> its path: submitted, no result yet
  std::set<std::string> failed_here;            // paths: not retried with --retry-failed until they change
  std::map<std::string, std::string> last_said;  // view -> the last line printed for it
  // Paths that ended transient: taken again from the listing `at` on, the wait doubling with
  // each such end in a row (1, 2, 4 ... 32 listings), so that an entry that cannot be compiled
  // here for a lasting reason (compiles off, S3 refusing) is not taken at every listing.
  struct Backoff {
    std::size_t at = 0, wait = 0;
  };
  std::map<std::string, Backoff> backoff;
  const auto every = std::chrono::milliseconds(static_cast<int64_t>(opts.watch_interval * 1000));
  auto next_list = std::chrono::steady_clock::now();
  std::size_t listings = 0, failed_listings = 0;
  fmt::print(stderr, "neffcache: watching {} every {:g} s\n", cache.name(), opts.watch_interval);
  while (!g_stop) {
    if (std::chrono::steady_clock::now() >= next_list) {
      next_list = std::chrono::steady_clock::now() + every;
      ++listings;
      auto entries = cache.list(store::IfMissing::empty);
      if (!entries) {
        // (Tried again at the next listing: a farm outlives a moment without S3.)
        ++failed_listings;
        fmt::print(stderr, "neffcache: warning: {}\n", entries.error().message);
      } else {
        std::vector<const EntryInfo*> wanted;
        for (const auto& e : *entries) {
          const auto st = e.state;
          if (st != EntryState::failed) failed_here.erase(e.path);  // (it changed: a retry may fail anew)
          if (needs_compile(st, retry_failed) && !(st == EntryState::failed && failed_here.contains(e.path)))
            wanted.push_back(&e);
        }
        std::stable_sort(wanted.begin(), wanted.end(), [](const auto* a, const auto* b) { return a->bytes > b->bytes; });
        for (const auto* e : wanted) {
          const std::string view = cache.entry(*e).view();
          if (working.contains(view)) continue;
          if (auto b = backoff.find(e->path); b != backoff.end() && listings < b->second.at) continue;
          working.emplace(view, e->path);
          batch.add_again(view);  // (again: an entry that needs a compile again since its last result)
        }
      }
    }
    batch.wait_until(std::min(next_list, std::chrono::steady_clock::now() + k_tick));
    for (const auto& item : batch.items()) {
      auto w = working.find(item.entry_dir);
      if (!item.result || w == working.end()) continue;
      const CompileResult& r = *item.result;
      if (r.outcome == CompileOutcome::failed || r.outcome == CompileOutcome::failed_cached) failed_here.insert(w->second);
      if (r.outcome == CompileOutcome::transient) {
        auto& b = backoff[w->second];
        b.wait = std::min<std::size_t>(b.wait == 0 ? 1 : b.wait * 2, 32);
        b.at = listings + b.wait;
      } else {
        backoff.erase(w->second);
      }
      working.erase(w);
      std::string line;
      if (!r.twin.empty()) line = fmt::format("{}, the result of {}", to_string(r.outcome), r.twin);
      else if (r.outcome == CompileOutcome::success) line = fmt::format("compiled in {:.1f} s", r.compile_seconds);
      else line = fmt::format("{}{}{}", to_string(r.outcome), r.message.empty() ? "" : ": ", r.message);
      // (An entry that ends alike at every listing, such as one without its graph, is said once.)
      auto& said = last_said[item.entry_dir];
      if (said != line || r.outcome == CompileOutcome::success) fmt::print("{}: {}\n", item.entry_dir, line);
      said = line;
    }
    std::fflush(stdout);
  }
  batch.shutdown();  // running compiles stop as transient failures; their holds are given back
  const auto c = batch.counts();
  fmt::print(stderr, "neffcache: stopped: {} entries taken, {} done, {} failed; {} listings ({} failed)\n", c.total,
             c.done, c.failed, listings, failed_listings);
  return k_exit_ok;
}

}  // namespace

// The end of a run: the Neuron tool's report, and its exit status.
static int finish_run(const CompileOptions& opts, const std::vector<Batch::Item>& items,
               std::chrono::system_clock::time_point start, std::chrono::steady_clock::time_point t0) {
  if (g_stop) return report("stopped by a signal; running compiles were stopped and nothing was recorded for them");
  auto result = neuron_report(items, start, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  tools::print_failures(items);
  if (opts.json) fmt::print("{}\n", result.dump(4));
  else tools::print_neuron_report(stdout, result);
  tools::dump_report(result, opts.seconds_before + result["compilation_time"].get<double>());
  return tools::failed_exit_status(result["compilation_summary"].value("false", std::size_t{0}));
}

int run_compile(const CompileOptions& opts) {
  auto cache = open_cache(opts.cache, Access::change);
  if (!cache) return report(cache.error());
  auto env = compiler_flags({});
  if (!env) return report(env.error());
  const bool retry_failed = opts.retry_failed || env->wrapper.retry_failed_compilation;
  const bool on_mount = (*cache)->compiles_on_open();
  auto so = scheduler_options(opts, *env, /*need_compiler=*/!on_mount);
  if (!so) return report(so.error());

  if (opts.watch) {
    if (on_mount || !opts.entries.empty())
      return report("--watch takes every entry of a cache that compiles here (a folder or a bucket, not a mount), "
                    "none named");
    std::signal(SIGINT, [](int) { g_stop = 1; });
    std::signal(SIGTERM, [](int) { g_stop = 1; });
    return run_watch(opts, **cache, std::move(*so), env->compiler_flags, retry_failed);
  }
  std::vector<Target> targets;
  if (!opts.entries.empty()) {
    for (const auto& arg : opts.entries) {
      auto entry = (*cache)->named(arg);
      if (!entry) return report(entry.error());
      targets.push_back({entry->view()});
    }
    sort_unique(targets);
  } else {
    auto entries = (*cache)->list();
    if (!entries) return report(entries.error());
    targets = pick(**cache, *entries, retry_failed, opts.share);
  }
  store::compile_through(**cache, *so);

  std::signal(SIGINT, [](int) { g_stop = 1; });
  std::signal(SIGTERM, [](int) { g_stop = 1; });
  if (tools::logs(tools::LogLevel::info))
    fmt::print(stderr, "INFO ||NEURON_CACHE||: Compile cache path: {}\n", (*cache)->name());
  const auto start = std::chrono::system_clock::now();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Batch::Item> items;
  if (on_mount) {
    // The daemon keeps a recorded failure until it is cleared (in the backing folder,
    // where an LNL entry's is kept: own_files).
    if (retry_failed)
      for (const auto& t : targets)
        if (auto e = (*cache)->of_folder(t.entry)) (void)(*cache)->clear_failure(*e);
    items = ask_daemon(targets);
  } else {
    catch_up_index(**cache, env->compiler_flags);
    items = compile_here(targets, std::move(*so), env->compiler_flags);
  }
  return finish_run(opts, items, start, t0);
}

}  // namespace neffcache::cli
