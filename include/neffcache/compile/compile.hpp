// Compiling one cache entry: template, private work directory, the compiler run under
// the entry lock, outcome classification and atomic publication.
//
// Files a job writes in the entry (besides the Neuron ones):
//   .neffcache-compile.log  the compiler's output, streamed; becomes model.log only on
//                           a deterministic failure, so a half-written log never reads
//                           as "failed" to Neuron clients
//   .neffcache-meta.json    written before model.done: size, xxh3, command, flags,
//                           compile time, peak memory
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/clock.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/compile/runner.hpp>

namespace neffcache {

inline constexpr std::string_view k_default_compiler_template =
    "neuronx-cc compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags} --verbose=35";
inline constexpr std::chrono::seconds k_default_compile_timeout{4 * 60 * 60};
inline constexpr std::string_view k_compile_log_file = ".neffcache-compile.log";
inline constexpr std::string_view k_meta_file = ".neffcache-meta.json";

// Whether `program` can be run now: an executable path, or a name found executable in
// one of PATH's folders.
inline bool runnable(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  for (std::string_view rest = path ? path : ""; !rest.empty();) {
    auto dir = rest.substr(0, rest.find(':'));
    if (!dir.empty() && ::access(fmt::format("{}/{}", dir, program).c_str(), X_OK) == 0) return true;
    rest.remove_prefix(std::min(rest.size(), dir.size() + 1));
  }
  return false;
}

// A compiler command line with placeholders, split like NEURON_CC_FLAGS (no shell).
// {hlo} {neff} {workdir} {key} may stand inside a word ("--output={neff}"); {flags}
// must be a word of its own and becomes one word per flag.
class CompilerTemplate {
 public:
  struct Values {
    std::string hlo, neff, workdir, key;
    std::vector<std::string> flags;
  };

  // Errors (Errc::invalid_argument): empty, bad quoting, unknown placeholder, a stray
  // brace, {flags} inside a word, or no {hlo} or {neff}.
  static Result<CompilerTemplate> parse(std::string_view text) {
    auto bad = [&](std::string_view why) {
      return Error{Errc::invalid_argument, fmt::format("bad compiler template '{}': {}", text, why)};
    };
    auto words = shell_split(text);
    if (!words) return bad(words.error().message);
    if (words->empty()) return bad("empty");
    bool hlo = false, neff = false;
    for (const auto& w : *words) {
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (w[i] == '}') return bad("'}' without '{'");
        if (w[i] != '{') continue;
        auto end = w.find('}', i);
        if (end == std::string::npos) return bad("'{' without '}'");
        std::string_view name(w.data() + i + 1, end - i - 1);
        if (name == "flags" && w != "{flags}") return bad("{flags} must be a word of its own");
        if (name != "hlo" && name != "neff" && name != "flags" && name != "workdir" && name != "key")
          return bad(fmt::format("unknown placeholder {{{}}} (known: hlo neff flags workdir key)", name));
        hlo |= name == "hlo";
        neff |= name == "neff";
        i = end;
      }
    }
    if (!hlo || !neff) return bad("it needs both {hlo} and {neff}");
    return CompilerTemplate(std::move(*words), std::string(text));
  }

  static const CompilerTemplate& default_template() {
    static const CompilerTemplate t = std::move(parse(k_default_compiler_template).value());
    return t;
  }

  std::vector<std::string> expand(const Values& v) const {
    std::vector<std::string> out;
    for (const auto& w : words_) {
      if (w == "{flags}") {
        out.insert(out.end(), v.flags.begin(), v.flags.end());
        continue;
      }
      std::string s;
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (w[i] != '{') {
          s += w[i];
          continue;
        }
        auto end = w.find('}', i);
        std::string_view name(w.data() + i + 1, end - i - 1);
        s += name == "hlo" ? v.hlo : name == "neff" ? v.neff : name == "workdir" ? v.workdir : v.key;
        i = end;
      }
      out.push_back(std::move(s));
    }
    return out;
  }

  const std::string& text() const { return text_; }
  // The program it runs: a path, or a name looked up on PATH.
  const std::string& program() const { return words_.front(); }

  // Whether program() can be run now (see runnable()).
  bool installed() const { return runnable(program()); }

 private:
  CompilerTemplate(std::vector<std::string> words, std::string text)
      : words_(std::move(words)), text_(std::move(text)) {}
  std::vector<std::string> words_;
  std::string text_;
};

struct CompileSettings {
  CompilerTemplate compiler = CompilerTemplate::default_template();
  // Flags for entries without compile_flags.json (wrapper options are removed).
  std::vector<std::string> default_flags;
  std::chrono::milliseconds timeout = k_default_compile_timeout;
  std::chrono::milliseconds kill_grace{10'000};
  int max_retries = 0;        // extra attempts after a transient failure
  bool retry_failed = false;  // compile entries with a recorded failure again
  std::string workdir_root;   // default: $TMPDIR or /tmp
  // Compilers run as this user (we must be root); work folders are theirs. Whoever runs
  // them, the files a compile writes into an entry belong to the entry HLO's owner when
  // we are root.
  std::optional<RunAs> run_as;
  LockOptions lock;
  ProcessRunner* runner = nullptr;  // default: a PosixRunner
  // Asked between heartbeats; returning true stops the compile as a transient failure.
  std::function<bool()> cancelled;
};

enum class CompileOutcome {
  success,        // compiled and published now
  already_done,   // the entry was done before we got to it
  failed,         // the compiler failed (exit status): model.log recorded
  failed_cached,  // a failure was already recorded and retry_failed is off
  transient,      // killed, timed out, cancelled, or an I/O problem: nothing recorded
  busy,           // someone else holds the entry lock
};

inline const char* to_string(CompileOutcome o) {
  switch (o) {
    case CompileOutcome::success: return "success";
    case CompileOutcome::already_done: return "already done";
    case CompileOutcome::failed: return "failed";
    case CompileOutcome::failed_cached: return "failed (cached)";
    case CompileOutcome::transient: return "transient failure";
    case CompileOutcome::busy: return "busy";
  }
  return "?";
}

inline bool is_success(CompileOutcome o) {
  return o == CompileOutcome::success || o == CompileOutcome::already_done;
}

struct CompileResult {
  CompileOutcome outcome = CompileOutcome::transient;
  std::string message;  // one line: why it failed, or who holds the lock
  int attempts = 0;     // compiler runs
  double compile_seconds = 0;
  long peak_rss_kib = 0;
};

// Transient-failure retries from NEURON_PARALLEL_COMPILE_MAX_RETRIES (unset or empty:
// 0, the Neuron default). Anything but a whole number from 0 to 100 is an error.
inline Result<int> max_retries_from_env(const std::function<std::optional<std::string>(const char*)>& env) {
  auto v = env("NEURON_PARALLEL_COMPILE_MAX_RETRIES");
  if (!v || v->empty()) return 0;
  int n = 0;
  bool ok = v->size() <= 3;
  for (char c : *v) ok = ok && c >= '0' && c <= '9', n = n * 10 + (c - '0');
  if (!ok || n > 100)
    return Error{Errc::invalid_argument,
                 fmt::format("NEURON_PARALLEL_COMPILE_MAX_RETRIES='{}' is not a number from 0 to 100", *v)};
  return n;
}

namespace detail {

inline std::string entry_name(const std::string& entry_dir) {
  return std::filesystem::path(entry_dir).filename().string();
}

// Copies `from` to `to` (created exclusively), fsyncs it and returns the xxh3 of the
// bytes copied; on failure `to` is removed.
inline Result<uint64_t> copy_file_hashed(const std::string& from, const std::string& to, mode_t mode,
                                         const std::optional<FileOwner>& owner = {}) {
  auto opened = open_regular(from);
  if (!opened) return opened.error();
  UniqueFd in = std::move(*opened);
  UniqueFd out(sys::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!out) return sys_error("create", to);
  give(out.get(), owner);
  auto fail = [&](Error e) -> Result<uint64_t> {
    sys::unlink(to.c_str());
    return e;
  };
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = sys::read(in.get(), buf.data(), buf.size());
    if (n < 0) return XXH3_freeState(st), fail(sys_error("read", from));
    if (n == 0) break;
    XXH3_64bits_update(st, buf.data(), static_cast<std::size_t>(n));
    if (auto w = write_all(out.get(), std::string_view(buf.data(), static_cast<std::size_t>(n)), to); !w)
      return XXH3_freeState(st), fail(w.error());
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (sys::fsync(out.get()) != 0) return fail(sys_error("fsync", to));
  return h;
}

// Removes a folder and everything in it without following a link at any depth: each
// step is taken from a descriptor of a folder already opened, so a link that someone
// swaps in meanwhile (a compiler run as another user owns its work folder) is removed,
// never followed. Folders deeper than `depth` stay.
inline void remove_tree_at(int parent, const std::string& name, int depth = 64) {
  UniqueFd dir(depth > 0 ? open_dir_at(parent, name.c_str()) : -1);
  std::vector<std::string> inside;
  if (dir) (void)list_dir(::dup(dir.get()), name, [&](std::string_view n, bool) { inside.emplace_back(n); });
  for (const auto& n : inside)  // unlinkat tells a folder by EISDIR, whatever the listing said
    if (::unlinkat(dir.get(), n.c_str(), 0) != 0 && errno == EISDIR) remove_tree_at(dir.get(), n, depth - 1);
  ::unlinkat(parent, name.c_str(), AT_REMOVEDIR);
}

// The owner that files written into an entry get: when we run as root, the owner of
// the entry's HLO, so that a root daemon leaves each user's entries to that user.
inline std::optional<FileOwner> entry_owner(const std::string& hlo_path) {
  struct stat st {};
  if (::geteuid() != 0 || ::lstat(hlo_path.c_str(), &st) != 0) return std::nullopt;
  return FileOwner{st.st_uid, st.st_gid};
}

// The xxh3 of a file's bytes, as publish() records it.
inline Result<uint64_t> file_xxh3(const std::string& path) {
  auto opened = open_regular(path);
  if (!opened) return opened.error();
  UniqueFd in = std::move(*opened);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = sys::read(in.get(), buf.data(), buf.size());
    if (n < 0) return XXH3_freeState(st), sys_error("read", path);
    if (n == 0) break;
    XXH3_64bits_update(st, buf.data(), static_cast<std::size_t>(n));
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

inline void fsync_dir(const std::string& dir) {
  UniqueFd fd(sys::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd) sys::fsync(fd.get());
}

// What a compiler prints when the machine, not the graph, made it fail: a full disk or
// quota, or no memory left on the host (errno texts, Python's and C++'s allocation
// errors). Such a failure is transient: recorded, it would poison an entry that compiles
// once space or memory is back. The compiler's own device-memory errors do not match.
inline std::optional<std::string_view> resource_exhaustion(std::string_view output) {
  for (std::string_view mark :
       {"No space left on device", "Disk quota exceeded", "Cannot allocate memory", "MemoryError", "std::bad_alloc"})
    if (output.find(mark) != std::string_view::npos) return mark;
  return std::nullopt;
}

// The last `max` bytes of what was written to `fd` from offset `from` on.
inline std::string read_tail(int fd, off_t from, std::size_t max) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= from) return {};
  off_t at = std::max<off_t>(from, st.st_size - static_cast<off_t>(max));
  std::string out(static_cast<std::size_t>(st.st_size - at), '\0');
  ssize_t n = sys::pread(fd, out.data(), out.size(), at);
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return out;
}

inline void log_line(int fd, std::string_view line) {
  (void)write_all(fd, fmt::format("neffcache: {}\n", line), "log");
}

// Publishes `neff` into the entry: copied to a temp file there, fsynced and renamed to
// model.neff; then the metadata (`meta` plus size and xxh3); then model.done. Readers
// see no model.neff, or a whole one. The files get the process's umask, never write
// access for others, and `owner`. Returns the published path.
inline Result<std::string> publish(const std::string& entry_dir, const std::string& neff,
                                   nlohmann::ordered_json meta, const std::optional<FileOwner>& owner = {}) {
  const std::string tmp = fmt::format("{}/{}-neff-{}", entry_dir, k_private_prefix, random_hex64());
  // (The kernel applies the umask to the mode. Reading it with umask() would change it
  // for a moment, for every thread of the process.)
  auto hash = copy_file_hashed(neff, tmp, 0666 & ~S_IWOTH, owner);
  if (!hash) return hash.error();
  const std::string path = fmt::format("{}/{}", entry_dir, k_neff_file);
  const std::string meta_path = fmt::format("{}/{}", entry_dir, k_meta_file);
  if (sys::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = sys_error("publish", path);
    sys::unlink(tmp.c_str());
    return e;
  }
  // model.neff is in place: a failure from here on takes it away again, so that no
  // model.neff stands without its model.done (the next attempt publishes anew).
  auto undo = [&](Error e) {
    sys::unlink(meta_path.c_str());
    sys::unlink(path.c_str());
    return e;
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return undo(sys_error("stat", path));
  meta["size"] = st.st_size;
  meta["xxh3"] = fmt::format("{:016x}", *hash);
  if (auto m = write_file_atomic(meta_path, meta.dump(2) + "\n", 0644, owner); !m) return undo(m.error());
  if (auto d = write_file_atomic(fmt::format("{}/{}", entry_dir, k_done_file), "", 0644, owner); !d)
    return undo(d.error());
  fsync_dir(entry_dir);
  return path;
}

}  // namespace detail

// Removes the half-written copies of a NEFF or a log that a publisher left in
// `entry_dir` when it died mid-copy. Only the entry's lock holder writes them, so the
// caller must hold the lock; other private files (a lock being created) stay.
inline void remove_publish_leftovers(const std::string& entry_dir) {
  const std::string neff = fmt::format("{}-neff-", k_private_prefix), log = fmt::format("{}-log-", k_private_prefix);
  std::vector<std::string> doomed;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(entry_dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.starts_with(neff) || name.starts_with(log)) doomed.push_back(f.path().string());
  }
  for (const auto& path : doomed) sys::unlink(path.c_str());
}

// What an entry's files already say of it: done, a recorded failure (unless failures are
// retried), or nothing yet.
inline std::optional<CompileOutcome> settled_outcome(const EntryFiles& f, bool retry_failed) {
  if (f.done()) return CompileOutcome::already_done;
  if (f.failed() && !retry_failed) return CompileOutcome::failed_cached;
  return std::nullopt;
}

// Compiles one entry folder if it needs it. Never throws and never blocks on another
// holder: a held lock is CompileOutcome::busy. See CompileOutcome for what each result
// leaves behind; no outcome leaves a partial model.neff or a lock file.
inline CompileResult compile_entry(const std::string& entry_dir, const CompileSettings& s) {
  using namespace std::chrono;
  CompileResult r;
  auto transient = [&](std::string why) {
    r.outcome = CompileOutcome::transient;
    r.message = std::move(why);
    return r;
  };
  auto files = read_entry_files(entry_dir);
  if (!files) return transient(files.error().message);
  if (auto o = settled_outcome(*files, s.retry_failed)) return r.outcome = *o, r;
  if (!files->has_hlo()) return transient(fmt::format("{}: no HLO file to compile", entry_dir));

  auto lock = EntryLock::try_acquire(entry_lock_path(entry_dir, *files), s.lock);
  if (!lock) {
    r.outcome = lock.error().code == Errc::busy ? CompileOutcome::busy : CompileOutcome::transient;
    r.message = lock.error().message;
    return r;
  }
  // Re-check under the lock: whoever held it before may have finished the entry.
  files = read_entry_files(entry_dir);
  if (!files) return transient(files.error().message);
  if (auto o = settled_outcome(*files, s.retry_failed)) return r.outcome = *o, r;
  remove_publish_leftovers(entry_dir);
  const std::string hlo_path = fmt::format("{}/{}", entry_dir, *files->hlo_name());
  const std::string log_path = fmt::format("{}/{}", entry_dir, k_compile_log_file);
  const std::string key = detail::entry_name(entry_dir);

  const auto owner = detail::entry_owner(hlo_path);
  // Never through a link: in a user's entry it could name any file, which root would truncate.
  detail::UniqueFd log(sys::open(log_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!log) return transient(sys_error("create", log_path).message);
  detail::give(log.get(), owner);
  // A deterministic failure moves the log into place as model.log, fully written.
  auto record_failure = [&](std::string why) {
    detail::log_line(log.get(), why);
    log.reset();
    sys::unlink(fmt::format("{}/{}", entry_dir, k_neff_file).c_str());
    if (sys::rename(log_path.c_str(), fmt::format("{}/{}", entry_dir, k_log_file).c_str()) != 0)
      return transient(sys_error("record failure in", entry_dir).message);
    detail::fsync_dir(entry_dir);
    r.outcome = CompileOutcome::failed;
    r.message = std::move(why);
    return r;
  };

  std::vector<std::string> flags = s.default_flags;
  if (files->has(EntryFile::flags)) {
    auto from_entry = read_compile_flags(fmt::format("{}/{}", entry_dir, k_compile_flags_file));
    // Bad contents are the entry's fault; a failed read is not, and may pass.
    if (!from_entry && from_entry.error().code == Errc::io) return transient(from_entry.error().message);
    if (!from_entry) return record_failure(from_entry.error().message);
    flags = std::move(*from_entry);
  }
  auto parsed = separate_wrapper_options(flags);
  if (!parsed) return record_failure(parsed.error().message);
  flags = std::move(parsed->compiler_flags);
  // A retried failure: the old record goes only once we really compile again.
  sys::unlink(fmt::format("{}/{}", entry_dir, k_log_file).c_str());

  std::string root = s.workdir_root;
  if (root.empty()) root = detail::getenv_or("TMPDIR", "/tmp");
  PosixRunner posix;
  ProcessRunner& runner = s.runner ? *s.runner : posix;
  const std::string hlo_suffix(files->hlo_name()->substr(std::string_view("model").size()));

  for (int attempt = 0; attempt <= s.max_retries; ++attempt) {
    std::string tmpl = fmt::format("{}/neffcache-{}-XXXXXX", root, key.substr(0, 64));
    if (!sys::mkdtemp(tmpl.data())) return transient(sys_error("create work directory in", root).message);
    const std::string workdir = tmpl;
    struct Cleanup {
      std::string dir;
      ~Cleanup() { detail::remove_tree_at(AT_FDCWD, dir); }
    } cleanup{workdir};
    CompilerTemplate::Values v{fmt::format("{}/model.{}{}", workdir, key, hlo_suffix),
                               fmt::format("{}/model.{}.neff", workdir, key), workdir, key, flags};
    if (auto c = detail::copy_file_hashed(hlo_path, v.hlo, 0644); !c)
      return c.error().code == Errc::invalid_argument ? record_failure(c.error().message) : transient(c.error().message);
    // A compiler run as another user writes into a work folder of its own. (What it
    // leaves there is read without following links: see open_regular.)
    if (s.run_as && ::chown(workdir.c_str(), s.run_as->uid, s.run_as->gid) != 0)
      return transient(sys_error("give the work directory to", s.run_as->name).message);

    RunSpec spec;
    spec.argv = s.compiler.expand(v);
    spec.cwd = workdir;
    spec.log_fd = log.get();
    spec.timeout = s.timeout;
    spec.kill_grace = s.kill_grace;
    // Should we die, the entry stays locked until the compiler is gone too.
    spec.inherit_fd = lock->descriptor();
    spec.run_as = s.run_as;
    // Ticks often enough to notice a cancel quickly; heartbeats when one is due.
    spec.tick_interval = std::min<milliseconds>(s.lock.heartbeat_interval(), milliseconds(250));
    std::string stop_reason;
    auto last_beat = steady_clock::now();
    spec.tick = [&] {
      if (steady_clock::now() - last_beat >= s.lock.heartbeat_interval()) {
        last_beat = steady_clock::now();
        if (auto hb = lock->heartbeat(); !hb) return stop_reason = hb.error().message, false;
      }
      if (s.cancelled && s.cancelled()) return stop_reason = "cancelled", false;
      return true;
    };
    std::string command;
    for (const auto& a : spec.argv) command += (command.empty() ? "" : " ") + a;
    detail::log_line(log.get(), fmt::format("attempt {} in {}: {}", attempt + 1, workdir, command));

    const off_t output_from = ::lseek(log.get(), 0, SEEK_END);
    auto run = runner.run(spec);
    ++r.attempts;
    if (!run) return transient(run.error().message);  // e.g. compiler not on PATH
    r.compile_seconds = duration<double>(run->wall).count();
    r.peak_rss_kib = std::max(r.peak_rss_kib, run->peak_rss_kib);

    std::string why;
    switch (run->end) {
      case RunEnd::exited:
        // 128+9: a shell or launcher reporting that its child was SIGKILLed, which on
        // these machines is nearly always the out-of-memory killer.
        if (run->exit_code == 128 + SIGKILL) why = "compiler reported SIGKILL (exit 137): out of memory?";
        else if (run->exit_code != 0) {
          auto exhausted = detail::resource_exhaustion(detail::read_tail(log.get(), output_from, 64 << 10));
          if (!exhausted) return record_failure(fmt::format("compiler exited with status {}", run->exit_code));
          why = fmt::format("compiler exited with status {} and printed '{}'", run->exit_code, *exhausted);
        }
        else if (!std::filesystem::exists(v.neff)) return record_failure("compiler exited 0 but wrote no NEFF");
        break;
      case RunEnd::signaled:
        why = fmt::format("compiler killed by signal {}{}", run->signal,
                          run->signal == SIGKILL ? " (out of memory?)" : "");
        break;
      case RunEnd::timed_out:
        why = fmt::format("compiler timed out after {} s", duration_cast<seconds>(s.timeout).count());
        break;
      case RunEnd::cancelled:
        why = fmt::format("compile stopped: {}", stop_reason);
        break;
    }
    if (!why.empty()) {
      detail::log_line(log.get(), why + " (transient: nothing recorded)");
      r.message = why;
      // A lost lock or a cancel is final; the other transients may be retried.
      if (run->end == RunEnd::cancelled) break;
      continue;
    }

    nlohmann::ordered_json meta{{"compiler", spec.argv},
                                {"flags", flags},
                                {"compile_seconds", r.compile_seconds},
                                {"peak_rss_kib", r.peak_rss_kib},
                                {"attempts", r.attempts},
                                {"host", detail::current_process().host}};
    auto published = detail::publish(entry_dir, v.neff, std::move(meta), owner);
    if (!published) return transient(published.error().message);
    detail::log_line(log.get(), fmt::format("published {} ({} bytes) in {:.2f} s", *published,
                                            std::filesystem::file_size(*published), r.compile_seconds));
    r.outcome = CompileOutcome::success;
    r.message.clear();
    return r;
  }
  r.outcome = CompileOutcome::transient;
  return r;
}

// Gives `entry_dir` the result of `source_dir`, an entry with the same canonical graph,
// flags and compiler that was just compiled: its NEFF (success) or its model.log
// (a deterministic failure), under the target's own lock. Busy when that lock is held.
inline CompileResult copy_result(const std::string& source_dir, const std::string& entry_dir,
                                 const CompileSettings& s) {
  CompileResult r;
  auto fail = [&](CompileOutcome o, std::string why) {
    r.outcome = o;
    r.message = std::move(why);
    return r;
  };
  auto source = read_entry_files(source_dir);
  if (!source) return fail(CompileOutcome::transient, source.error().message);
  auto files = read_entry_files(entry_dir);
  if (!files) return fail(CompileOutcome::transient, files.error().message);
  auto lock = EntryLock::try_acquire(entry_lock_path(entry_dir, *files), s.lock);
  if (!lock)
    return fail(lock.error().code == Errc::busy ? CompileOutcome::busy : CompileOutcome::transient,
                lock.error().message);
  files = read_entry_files(entry_dir);
  if (!files) return fail(CompileOutcome::transient, files.error().message);
  if (files->done()) return fail(CompileOutcome::already_done, "");
  const auto owner =
      files->hlo_name() ? detail::entry_owner(fmt::format("{}/{}", entry_dir, *files->hlo_name())) : std::nullopt;
  if (source->done()) {
    nlohmann::ordered_json meta{{"copied_from", detail::entry_name(source_dir)}};
    sys::unlink(fmt::format("{}/{}", entry_dir, k_log_file).c_str());
    auto p = detail::publish(entry_dir, fmt::format("{}/{}", source_dir, k_neff_file), std::move(meta), owner);
    if (!p) return fail(CompileOutcome::transient, p.error().message);
    return fail(CompileOutcome::success, "");
  }
  if (source->has(EntryFile::log)) {
    const std::string tmp = fmt::format("{}/{}-log-{}", entry_dir, k_private_prefix, detail::random_hex64());
    auto c = detail::copy_file_hashed(fmt::format("{}/{}", source_dir, k_log_file), tmp, 0644, owner);
    if (!c) return fail(CompileOutcome::transient, c.error().message);
    if (sys::rename(tmp.c_str(), fmt::format("{}/{}", entry_dir, k_log_file).c_str()) != 0) {
      sys::unlink(tmp.c_str());
      return fail(CompileOutcome::transient, sys_error("record failure in", entry_dir).message);
    }
    return fail(CompileOutcome::failed, fmt::format("same graph as {}, which failed", detail::entry_name(source_dir)));
  }
  return fail(CompileOutcome::transient, fmt::format("{} has no result to copy", source_dir));
}

}  // namespace neffcache
