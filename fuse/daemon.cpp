// neffcachefs [OPTIONS] BACKING MOUNTPOINT: mounts a Neuron compile cache so that opening
// a missing model.neff compiles it. run_daemon parses options, checks the ground and runs the
// FUSE loop.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/core/size.hpp>
#include <neffcache/cache/location.hpp>
#include <neffcache/store/directory.hpp>
#include <neffcache/store/metrics.hpp>
#include <neffcache/store/tier.hpp>

#include "common/version.hpp"

#include "daemon.hpp"
#include "fs.hpp"
#include "metrics_file.hpp"
#include "passthrough.hpp"
#include "scratch_dir.hpp"
#include "systemd_notify.hpp"

namespace {

constexpr int k_exit_error = 1;
constexpr int k_exit_usage = 2;

int fail(const std::string& message) {
  fmt::print(stderr, "neffcachefs: error: {}\n", message);
  return k_exit_error;
}

// A mount point that is itself a mount (of anything) is busy.
bool is_mounted(const std::string& dir) {
  struct stat a {}, b {};
  if (::stat(dir.c_str(), &a) != 0 || ::stat((dir + "/..").c_str(), &b) != 0) return false;
  return a.st_dev != b.st_dev || a.st_ino == b.st_ino;
}

}  // namespace

namespace neffcachefs {

int run_daemon(int argc, char** argv) {
  CLI::App app{"neffcachefs: mount a Neuron compile cache that compiles a missing model.neff when it is opened"};
  std::string backing, mountpoint, compiler(neffcache::k_default_compiler_template), flags_text, mem_per_job = "64G",
      compiler_user, local_cache, local_cache_size = "50G", mem_budget, mem_ledger, nki_kernels, upper;
  std::vector<std::string> lowers;
  double lease_ttl = static_cast<double>(neffcache::k_default_lease_ttl.count());
  std::vector<std::string> fuse_opts;
  int jobs = 0, retries = -1;
  double compile_timeout = static_cast<double>(neffcache::k_default_compile_timeout.count());
  double wait_timeout = 0;
  bool retry_failed = false, foreground = false, eager = true, content_index = true, no_compile = false,
       wait_for_farm = false;
  bool passthrough = true;
  std::size_t index_scan = 10000;
  std::string metrics_path;
  double metrics_interval = 15;
  app.add_option("BACKING", backing, "the cache the mount shows: a directory, or s3://bucket/prefix")->required();
  app.add_option("MOUNTPOINT", mountpoint, "where to mount, e.g. /var/tmp/neuron-compile-cache")->required();
  app.add_option("--compiler", compiler, "compiler command template ({hlo} {neff} {flags} {workdir} {key})")
      ->envname("NEFFCACHE_COMPILER")  // (a systemd unit's settings: one word however many spaces)
      ->capture_default_str();
  app.add_option("-j,--jobs", jobs, "compiles at once (default: min(cores, ceil(RAM / --mem-per-job)))");
  app.add_option("--mem-per-job", mem_per_job, "memory one compile may need, for the default of --jobs")
      ->capture_default_str();
  app.add_option("--mem-budget", mem_budget,
                 fmt::format("host memory that compiles may reserve, shared by every neffcache process on the "
                             "host: a size (48GiB), a share of the memory this process may use (70%), or off (admit "
                             "by --jobs only) (default: NEFFCACHE_MEM_BUDGET, else {:.0f}% of the smaller of RAM "
                             "and this process's cgroup limit)",
                             neffcache::k_default_budget_share * 100));
  app.add_option("--mem-ledger", mem_ledger,
                 fmt::format("the folder of the host's memory reservations (default: NEFFCACHE_MEM_LEDGER, else {})",
                             neffcache::k_default_ledger_dir));
  app.add_option("--flags", flags_text, "compiler flags for entries without compile_flags.json "
                                        "(default: NEURON_CC_FLAGS without the cache-wrapper options)");
  app.add_option("--compile-timeout", compile_timeout, "seconds before a compile is stopped (transient failure)")
      ->capture_default_str();
  app.add_option("--wait-timeout", wait_timeout, "seconds an open may wait for a compile before it fails "
                                                "with EIO while the compile goes on (default 0: no limit of its own)")
      ->capture_default_str();
  app.add_option("--retries", retries, "retries of transient failures (default: NEURON_PARALLEL_COMPILE_MAX_RETRIES or 0)");
  app.add_flag("--retry-failed", retry_failed, "compile entries with a recorded failure again when opened "
                                               "(also on with --retry_failed_compilation in NEURON_CC_FLAGS)");
  app.add_flag("--eager,!--no-eager", eager, "compile an HLO as soon as it is written through the mount (default on)");
  app.add_flag("--passthrough,!--no-passthrough", passthrough,
               "let the kernel read done files without the daemon (FUSE passthrough: root, Linux 6.9, libfuse "
               "3.16; default on where all three are)");
  auto* off = app.add_flag("--no-compile", no_compile,
               "never compile: opening a NEFF that is not done fails at once with EIO (EIO 07 in the log); done "
               "entries, equal graphs the content index knows and, over S3, the bucket's entries are still served");
  auto* farm = app.add_flag("--wait-for-farm", wait_for_farm,
               "with an s3:// cache: never compile here; an open of an entry the bucket lacks done waits (up to "
               "--wait-timeout) until a compile farm (neffcache compile --watch) publishes it, whose inputs go up "
               "for the farm to take; the compiler need not be installed");
  farm->excludes(off);  // (one waits for another host's compile, the other fails at once)
  app.add_flag("--content-index,!--no-content-index", content_index,
               "reuse the result of an equal graph compiled before under another name (default on)");
  app.add_option("--index-scan", index_scan, "HLOs the start-up scan may read to index done entries the content "
                                             "index does not know yet (default 10000; 0: none)");
  app.add_flag("-f,--foreground", foreground, "stay in the foreground");
  app.add_option("--compiler-user", compiler_user, "run compiles as this user (name or uid); the daemon must run as root");
  app.add_option("--local-cache", local_cache, "with an s3:// cache: the local folder that holds what the mount "
                                              "shows (created if missing)");
  app.add_option("--local-cache-size", local_cache_size, "with an s3:// cache: NEFF bytes kept in --local-cache, "
                                                        "least recently opened leaving first")
      ->capture_default_str();
  app.add_option("--lease-ttl", lease_ttl, "with an s3:// cache: seconds an entry's S3 lease lives without renewal "
                                          "(a dead host's compile is taken over after this)")
      ->capture_default_str();
  app.add_option("--nki-kernels", nki_kernels,
                 fmt::format("with an s3:// cache: the folder of the NKI kernel binaries that graphs call by path, "
                             "carried through the bucket (default: ${}, else {})",
                             neffcache::k_nki_kernel_dir_env, neffcache::k_default_nki_kernel_dir));
  app.add_option("--upper", upper,
                 "a folder that takes everything written through the mount, new entries and compiles; BACKING "
                 "becomes a read-only layer under it");
  app.add_option("--lower", lowers, "another read-only cache under BACKING (repeatable; the first that has a name "
                                    "wins); or one s3:// bucket, read-only, with BACKING as its local folder")
      ->allow_extra_args(false);
  app.add_option("-o", fuse_opts, "FUSE mount options, e.g. -o allow_other (default_permissions is always on)");
  app.add_option("--metrics-file", metrics_path,
                 "write the daemon's metrics in Prometheus' text format to this file (e.g. for node_exporter's "
                 "textfile collector: DIR/neffcache.prom), replaced whole every --metrics-interval seconds and when "
                 "the daemon stops");
  app.add_option("--metrics-interval", metrics_interval, "seconds between two writes of --metrics-file")
      ->capture_default_str();
  app.set_version_flag("-V,--version",
                       fmt::format("neffcachefs (neffcache) {}\nlibfuse {}{}", neffcache::program_version(),
                                   fuse_pkgversion(),
                                   neffcachefs::k_libfuse_has_passthrough ? " (with FUSE passthrough)" : ""),
                       "print the version (and libfuse's) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : k_exit_usage;
  }
  if (auto why = neffcachefs::prepare_systemd_notify(); !why.empty()) return fail(why);

  // Every path the daemon keeps is absolute and normalized: libfuse moves the daemon to /
  // before the loop (and unmounts by the mount point's path).
  auto absolute = [](const std::string& dir) {
    std::error_code failed;
    std::string a = std::filesystem::absolute(dir, failed).lexically_normal().string();
    if (a.size() > 1 && a.back() == '/') a.pop_back();
    return a;
  };
  if (!metrics_path.empty()) {
    if (!(metrics_interval >= 0.1 && metrics_interval <= 86400))
      return fail("--metrics-interval must be from 0.1 to 86400 seconds");
    metrics_path = absolute(metrics_path);
    if (auto why = MetricsFile::check(metrics_path); !why.empty()) return fail(fmt::format("--metrics-file: {}", why));
  }

  neffcachefs::Options opts;
  if (!compiler_user.empty()) {
    auto user = neffcache::find_user(compiler_user);
    if (!user) return fail(fmt::format("--compiler-user: {}", user.error().message));
    if (::geteuid() != 0) return fail("--compiler-user needs the daemon to run as root");
    if (!neffcache::runnable("setpriv")) return fail("--compiler-user needs setpriv (util-linux) on PATH");
    opts.scheduler.settings.run_as = std::move(*user);
  }
  std::error_code ec;
  std::optional<neffcache::CacheUrl> s3_url;
  // A bucket as a read-only layer under BACKING (--lower s3://...): BACKING is its local
  // folder, which takes what the bucket lacks (s3/tier.hpp, Options::read_only).
  bool bucket_lower = false;
  if (std::any_of(lowers.begin(), lowers.end(), [](const auto& l) { return l.starts_with("s3://"); })) {
    if (lowers.size() > 1 || !upper.empty() || backing.starts_with("s3://") || !local_cache.empty())
      return fail("--lower s3://... is the only layer under BACKING, which is its local folder: no --upper, no "
                  "other --lower, no --local-cache");
    if (wait_for_farm) return fail("--wait-for-farm is for a bucket mounted as the cache, not as a read-only layer");
    bucket_lower = true;
    local_cache = backing;
    std::filesystem::create_directories(local_cache, ec);
    backing = lowers.front();
    lowers.clear();
  }
  if (backing.starts_with("s3://")) {
    auto url = neffcache::parse_cache_url(backing);
    if (!url) return fail(url.error().message);
    if (local_cache.empty()) return fail("an s3:// cache needs --local-cache DIR, the local folder the mount shows");
    auto client = neffcache::S3Client::open(*url);
    if (!client) return fail(client.error().message);
    // One look now, so that a wrong address, bucket or secret fails here and not at
    // every open.
    if (auto l = (*client)->list(url->prefix.empty() ? "" : url->prefix + "/", "/", 1); !l)
      return fail(l.error().message);
    std::filesystem::create_directories(local_cache, ec);
    s3_url = *url;
    // Without links: the tier knows its entries by the paths the daemon reads back from
    // its descriptors.
    backing = std::filesystem::weakly_canonical(local_cache, ec).string();
  } else if (wait_for_farm) {
    return fail("--wait-for-farm is for an s3:// cache (a bucket a compile farm compiles into)");
  } else if (!local_cache.empty()) {
    return fail("--local-cache is for an s3:// cache; a directory cache is mounted as it is");
  } else if (!nki_kernels.empty()) {
    return fail("--nki-kernels is for an s3:// cache: a directory cache carries no kernels between hosts");
  }
  struct stat st {};
  auto is_dir = [&](const std::string& dir, int how) {
    return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(dir.c_str(), how) == 0;
  };
  opts.backing = absolute(backing);
  if (s3_url && (!upper.empty() || !lowers.empty()))
    return fail("--upper and --lower DIR are for directory caches (a bucket under a local folder: BACKING with "
                "--lower s3://...)");
  // Layers (fuse/layers.hpp): the backing is written unless it is read-only or --upper
  // takes the writes; read-only caches lie under it.
  for (auto& lower : lowers) {
    lower = absolute(lower);
    if (!is_dir(lower, R_OK | X_OK)) return fail(fmt::format("--lower {} is missing or not readable", lower));
  }
  ScratchDir scratch;  // (over a read-only cache without --upper)
  if (!upper.empty()) {
    if (!is_dir(opts.backing, R_OK | X_OK)) return fail(fmt::format("backing directory {} is missing or not readable", backing));
    lowers.insert(lowers.begin(), opts.backing);
    opts.backing = absolute(upper);
    if (!is_dir(opts.backing, R_OK | W_OK | X_OK))
      return fail(fmt::format("--upper {} is missing or not readable and writable", upper));
  } else if (!s3_url && is_dir(opts.backing, R_OK | X_OK) && !is_dir(opts.backing, W_OK)) {
    if (auto why = scratch.make(neffcache::detail::getenv_or("TMPDIR", "/tmp"), opts.backing); !why.empty())
      return fail(why);
    lowers.insert(lowers.begin(), opts.backing);
    opts.backing = scratch.path();
    opts.scratch = true;
    opts.scheduler.settings.compiles_off = "the cache is read-only and the mount has no --upper";
    fmt::print(stderr, "neffcachefs: {} is read-only: serving its done entries; lock files that clients create are "
                       "kept in {} until the mount ends; nothing compiles (give --upper DIR to compile)\n",
               lowers.front(), scratch.path());
  }
  if (!is_dir(opts.backing, R_OK | W_OK | X_OK))
    return fail(fmt::format("backing directory {} is missing or not readable", backing));
  opts.lowers = lowers;
  mountpoint = absolute(mountpoint);
  if (::stat(mountpoint.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return fail(fmt::format("mount point {} is missing or not a directory", mountpoint));
  if (is_mounted(mountpoint)) return fail(fmt::format("mount point {} is busy: something is mounted there", mountpoint));
  opts.mountpoint = mountpoint;
  // (Its first write comes before the mount answers anything: the daemon would wait for itself.)
  if (!metrics_path.empty() && (mountpoint == "/" || metrics_path.starts_with(mountpoint + "/")))
    return fail(fmt::format("--metrics-file {} is inside the mount point", metrics_path));
  if (std::filesystem::equivalent(opts.backing, mountpoint, ec))
    return fail("the backing directory and the mount point must differ");
  for (const auto& lower : opts.lowers)
    if (std::filesystem::equivalent(lower, mountpoint, ec) || std::filesystem::equivalent(lower, opts.backing, ec))
      return fail(fmt::format("the layer {} is the mount point or the backing directory", lower));

  // A fleet that never compiles need not have the compiler.
  auto tmpl = neffcache::compiler_option(
      compiler, no_compile || wait_for_farm || opts.scratch ? neffcache::Installed::not_required
                                                            : neffcache::Installed::required);
  if (!tmpl) return fail(tmpl.error().message);
  opts.scheduler.settings.compiler = *tmpl;
  // The mount's entries are folders (the backing's, or the local tier's over S3): their
  // files say whether one is settled.
  opts.scheduler.settled = neffcache::folder_settled;

  auto env_flags = neffcache::parse_neuron_cc_flags(neffcache::process_env("NEURON_CC_FLAGS").value_or(""));
  if (!env_flags) return fail(fmt::format("NEURON_CC_FLAGS: {}", env_flags.error().message));
  if (!flags_text.empty()) {
    auto given = neffcache::parse_neuron_cc_flags(flags_text);
    if (!given) return fail(fmt::format("--flags: {}", given.error().message));
    opts.default_flags = given->compiler_flags;
  } else {
    opts.default_flags = env_flags->compiler_flags;
  }
  opts.retry_failed = retry_failed || env_flags->wrapper.retry_failed_compilation;
  // Nothing compiles, so nothing is eager and nothing reserves memory.
  if (no_compile) opts.scheduler.settings.compiles_off = "compiles are off (neffcachefs --no-compile)";
  no_compile |= opts.scratch;
  opts.eager = eager && !no_compile;
  opts.passthrough = passthrough;
  // (Over a read-only cache without --upper no twin can be served: nowhere to put it.)
  opts.scheduler.settings.content_index = content_index && !opts.scratch;
  opts.index_scan = index_scan;
  opts.scheduler.settings.log = [](std::string_view line) { fmt::print(stderr, "neffcachefs: {}\n", line); };
  // Which compiler folder the compiler serves (compiler_serves): asked once here, for what
  // the mount shows; each compile asks again, so a compiler replaced meanwhile compiles
  // nothing of another folder.
  if (!no_compile && !wait_for_farm) {
    const auto& settings = opts.scheduler.settings;
    if (auto version = neffcache::compiler_version(settings)) {
      opts.compiler_dir = neffcache::compiler_dir_name(*version);
      fmt::print(stderr, "neffcachefs: compiler '{}' reports version {}: it compiles the entries of {} and LNL's; "
                         "the other neuronxcc-* folders pass through as they are\n",
                 settings.compiler.program(), *version, *opts.compiler_dir);
    } else {
      opts.compiler_dir = "";
      fmt::print(stderr, "neffcachefs: compiler '{}' reports no version ('{} --version'): it compiles LNL's entries "
                         "only; the neuronxcc-* folders pass through as they are\n",
                 settings.compiler.program(), settings.compiler.program());
    }
  }

  auto mem = neffcache::parse_size(mem_per_job);
  if (!mem || *mem == 0) return fail(fmt::format("--mem-per-job '{}' is not a size like 64G", mem_per_job));
  opts.scheduler.jobs = jobs > 0 ? jobs : neffcache::default_jobs(*mem);
  auto ledger = neffcache::open_memory_ledger(mem_budget, mem_ledger, "neffcachefs", opts.scheduler.settings.log);
  if (!ledger) return fail(ledger.error().message);
  // Over S3 the scheduler's jobs are fetches as often as compiles, and it cannot tell them
  // apart: admission by memory would hold a fetch for a compile's reservation. There,
  // compiles are admitted by count (the tier's slots).
  if (!s3_url && !no_compile) opts.scheduler.memory = std::move(*ledger);
  auto max_retries = neffcache::retries_option(retries, neffcache::process_env);
  if (!max_retries) return fail(max_retries.error().message);
  opts.scheduler.settings.max_retries = *max_retries;
  if (s3_url) {
    auto cap = neffcache::parse_size(local_cache_size);
    if (!cap) return fail(fmt::format("--local-cache-size '{}' is not a size like 50G", local_cache_size));
    if (lease_ttl < 1 || lease_ttl > static_cast<double>(neffcache::k_max_lease_ttl.count()))
      return fail(fmt::format("--lease-ttl must be from 1 to {} seconds", neffcache::k_max_lease_ttl.count()));
    neffcache::S3Tier::Options t;
    t.root = opts.backing;
    t.cap_bytes = *cap;
    t.compile_slots = opts.scheduler.jobs;
    t.read_only = bucket_lower;
    t.wait_for_farm = wait_for_farm;
    t.compile.lease_ttl = std::chrono::seconds(static_cast<int64_t>(lease_ttl));
    if (!nki_kernels.empty()) t.compile.nki_kernels = nki_kernels;
    if (!t.compile.nki_kernels.starts_with('/'))
      return fail(fmt::format("--nki-kernels {}: the kernel folder must be an absolute path, as graphs name kernels",
                              t.compile.nki_kernels));
    auto tier = neffcache::store::TierStore::open(*s3_url, std::move(t));
    if (!tier) return fail(tier.error().message);
    opts.store = std::move(*tier);
  } else {
    opts.store = opts.lowers.empty() ? neffcache::store::DirectoryStore::open(opts.backing)
                                     : neffcache::store::DirectoryStore::open_layers(opts.backing, opts.lowers);
  }
  if (compile_timeout <= 0) return fail("--compile-timeout must be positive");
  opts.scheduler.settings.timeout = std::chrono::milliseconds(static_cast<int64_t>(compile_timeout * 1000));
  if (wait_timeout < 0) return fail("--wait-timeout must not be negative");
  opts.wait_timeout = std::chrono::milliseconds(static_cast<int64_t>(wait_timeout * 1000));

  // Newer kernels can abort a FUSE request that takes too long, and with it the whole
  // mount; a reader's wait for a compile is one request.
  bool wait_bounded = wait_timeout > 0 && wait_timeout < compile_timeout;
  double longest_wait = wait_bounded ? wait_timeout : compile_timeout;
  for (const char* knob : {"/proc/sys/fs/fuse/default_request_timeout", "/proc/sys/fs/fuse/max_request_timeout"}) {
    auto text = neffcache::detail::read_file(knob);
    long seconds = text ? std::atol(text->c_str()) : 0;
    if (seconds > 0 && seconds < longest_wait)
      fmt::print(stderr, "neffcachefs: warning: {} is {} s, shorter than {} {} s: "
                         "the kernel may abort the mount while a reader waits for a compile\n",
                 knob, seconds, wait_bounded ? "--wait-timeout" : "--compile-timeout", longest_wait);
  }

  // Half the descriptors keep the most recently used names open (the rest are opened
  // again when needed), so more of them means fewer reopens during a walk: as many as
  // the system allows. Root may raise the hard limit up to fs.nr_open; otherwise the
  // soft limit goes up to the hard one.
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rlim_t nr_open = 0;
    std::ifstream("/proc/sys/fs/nr_open") >> nr_open;
    struct rlimit most {nr_open, nr_open};
    if (nr_open <= rl.rlim_max || ::setrlimit(RLIMIT_NOFILE, &most) != 0) {
      rl.rlim_cur = rl.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &rl);
    }
  }

  std::string mount_opts = "default_permissions,fsname=neffcache,subtype=neffcache";
  for (const auto& o : fuse_opts) mount_opts += "," + o;
  std::vector<std::string> fargs{"neffcachefs", "-o", mount_opts};
  std::vector<char*> fargv;
  for (auto& a : fargs) fargv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fargv.size()), fargv.data());

  neffcachefs::Filesystem fs(opts);
  fuse_session* se = fuse_session_new(&args, &neffcachefs::Filesystem::ops(), sizeof(fuse_lowlevel_ops), &fs);
  if (!se) {
    fuse_opt_free_args(&args);
    return fail("cannot create the FUSE session (bad -o option?)");
  }
  fs.set_session(se);
  if (fuse_set_signal_handlers(se) != 0) return fail("cannot install signal handlers");
  if (fuse_session_mount(se, mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return fail(fmt::format("cannot mount on {}", mountpoint));
  }
  neffcachefs::Filesystem::mounted(mountpoint);
  std::string served = opts.store->name();
  if (bucket_lower) served = fmt::format("{} over {} (read-only)", opts.backing, served);
  if (!opts.lowers.empty())
    served = opts.scratch ? fmt::format("{} (read-only)", opts.lowers.front())
                          : fmt::format("{} over {}", served, fmt::join(opts.lowers, ", "));
  fmt::print(stderr, "neffcachefs: {} mounted on {} ({})\n", served, mountpoint,
             opts.scratch ? std::string("nothing compiles")
                          : fmt::format("{} compile{} at once{}", opts.scheduler.jobs, opts.scheduler.jobs == 1 ? "" : "s",
                                        opts.scheduler.memory
                                            ? fmt::format(" at most, within {} of memory",
                                                          neffcache::format_size(opts.scheduler.memory->budget()))
                                            : ""));
  fuse_daemonize(foreground ? 1 : 0);

  // libfuse's handler for SIGTERM, SIGINT and SIGHUP ends the loop only if it runs in the
  // main thread, which waits for the loop (libfuse's worker threads block every signal).
  // Our own threads (prepare, reap, deadline, compile workers) start with them blocked,
  // since a thread inherits its creator's mask; then the main thread unblocks them. They
  // start only now, after daemonizing: the fork keeps only the thread that calls it.
  // Otherwise a stop signal could land in one of our threads: the loop then ran on until
  // the next request, and with none coming the daemon compiled its whole queue instead of
  // stopping (seen twice in the 10,000-entry burst test on a busy machine).
  sigset_t stop_signals, before;
  sigemptyset(&stop_signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &before);
  fs.start();
  std::optional<MetricsFile> metrics;
  if (!metrics_path.empty()) {
    const neffcache::store::MetricLabels labels{{"mount", mountpoint}};
    metrics.emplace(metrics_path, std::chrono::milliseconds(static_cast<int64_t>(metrics_interval * 1000)), [&fs, labels] {
      return neffcache::store::prometheus_build_info(neffcache::program_version(), labels) +
             neffcache::store::prometheus_text(neffcache::store::daemon_metrics(),
                                               fs.stats_document(/*with_opened=*/false), labels);
    });
    metrics->start();
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  notify_systemd(fmt::format("READY=1\nSTATUS={} mounted on {}", served, mountpoint));

  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, 64);
  int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  notify_systemd("STOPPING=1");
  // Answer every waiter (compiles stop as transient failures) while replies can still
  // reach the kernel, then unmount.
  fs.shutdown();
  if (metrics) metrics->stop();  // (the last counts)
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  fuse_opt_free_args(&args);
  // libfuse's signal handler records the signal as the loop's result: a stop by
  // SIGTERM, SIGINT or SIGHUP is a clean exit.
  bool clean = rc == 0 || rc == SIGTERM || rc == SIGINT || rc == SIGHUP;
  return clean ? 0 : k_exit_error;
}

}  // namespace neffcachefs
