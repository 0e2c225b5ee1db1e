// neuron-client-sim: the libneuronxla (torch-xla) dialect (see main.cpp).
#include "client_sim/sim.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <neffcache/core/file.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/compile/runner.hpp>

namespace neffcache::clientsim {

namespace {

// Our own compile, under the existence lock we hold, as libneuronxla does it.
GraphResult compile_here(const Graph& g, const CompilerTemplate& tmpl,
                         const std::vector<std::string>& flags) {
  GraphResult r;
  const std::string neff = g.entry + "/" + std::string(k_neff_file);
  if (auto s = store_graph(g.entry, g.bytes, flags); !s) return {Outcome::failed, 0, 0, s.error().message};
  std::string base = getenv_or("TMPDIR", "/tmp") + "/neuroncc_compile_workdir";
  fs::create_directories(base);
  std::string workdir = base + "/XXXXXX";
  if (!::mkdtemp(workdir.data())) return {Outcome::failed, 0, 0, sys_error("create", workdir).message};
  const std::string key = fs::path(g.entry).filename().string();
  const std::string hlo_copy = fmt::format("{}/model.{}.hlo_module.pb", workdir, key);
  const std::string neff_out = fmt::format("{}/model.{}.neff", workdir, key);
  const std::string log_path = workdir + "/compile.log";
  auto finish = [&](GraphResult res) {
    fs::remove_all(workdir);
    return res;
  };
  if (auto w = write_file_atomic(hlo_copy, g.bytes); !w) return finish({Outcome::failed, 0, 0, w.error().message});
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  RunSpec spec;
  spec.argv = tmpl.expand({hlo_copy, neff_out, workdir, key, flags});
  spec.cwd = workdir;
  spec.log_fd = log.get();
  PosixRunner runner;
  auto run = runner.run(spec);
  if (!run) return finish({Outcome::failed, 0, 0, run.error().message});
  if (run->end != RunEnd::exited || run->exit_code != 0 || !exists(neff_out)) {
    // A failure is cached, as the Neuron cache does: model.log with the compiler's output.
    (void)detail::copy_file_hashed(log_path, g.entry + "/" + std::string(k_log_file), 0644);
    return finish({Outcome::failed, 0, 0, fmt::format("the compiler failed; its output is in {}/{}", g.entry, k_log_file)});
  }
  ::unlink(neff.c_str());  // a partial copy of an earlier, killed client
  auto copied = detail::copy_file_hashed(neff_out, neff, 0644);
  if (!copied) return finish({Outcome::failed, 0, 0, copied.error().message});
  if (auto d = write_file_atomic(g.entry + "/" + std::string(k_done_file), ""); !d)
    return finish({Outcome::failed, 0, 0, d.error().message});
  r.outcome = Outcome::compiled;
  r.neff_bytes = static_cast<uint64_t>(fs::file_size(neff));
  return finish(r);
}

// The cache-wide lock libneuronxla takes for every look into its cache, hits included:
// <root>/lock, opened for writing (made if missing) and flocked. On a read-only cache
// this is where the real client stops ("[Errno 30] Read-only file system"), and so does
// the simulator, with the same words.
Result<UniqueFd> lock_cache_root(const std::string& root) {
  std::error_code ec;
  fs::create_directories(root, ec);  // (a cold cache; a read-only one fails below)
  const std::string path = root + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return Error{Errc::io, fmt::format("[Errno {}] {}: '{}'", errno, std::strerror(errno), path), errno};
  while (::flock(fd.get(), LOCK_EX) != 0)
    if (errno != EINTR) return sys_error("lock", path);
  return fd;
}

}  // namespace

// The first use of a graph in training.
GraphResult load(const Graph& g, const Options& opts, const CompilerTemplate& tmpl,
                 const std::vector<std::string>& flags, const std::string& root, const EntryKey& key) {
  const auto t0 = SteadyClock::now();
  const std::string neff = g.entry + "/" + std::string(k_neff_file);
  const std::string done = g.entry + "/" + std::string(k_done_file);
  const std::string log = g.entry + "/" + std::string(k_log_file);
  const std::string lock = g.entry + "/" + std::string(k_hlo_module_file) + ".lock";
  bool waited = false;
  int minutes_reported = 0;
  auto result = [&](GraphResult r) {
    r.seconds = since(t0);
    return r;
  };
  for (;;) {
    auto root_lock = lock_cache_root(root);
    if (!root_lock) return result({Outcome::failed, 0, 0, root_lock.error().message});
    if (exists(neff) && exists(done)) {
      auto n = read_neff(neff, g);
      if (!n) return result({Outcome::failed, 0, 0, n.error().message});
      fmt::print(stderr, "{} Using a cached neff at {}. Exiting with a successfully compiled graph.\n", k_cache_tag, neff);
      return result({waited ? Outcome::waited : Outcome::hit, 0, *n, {}});
    }
    if (exists(log) && !exists(neff)) {
      fmt::print(stderr,
                 "{} Got a cached failed neff at {}. Will skip compilation, please set --retry_failed_compilation "
                 "for recompilation.\n",
                 k_cache_tag, neff);
      return result({Outcome::failed, 0, 0, fmt::format("a cached failure: {}", log)});
    }
    if (auto e = make_entry_folder(root, key); !e) return result({Outcome::failed, 0, 0, e.error().message});
    int fd = ::open(lock.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    root_lock->reset();  // (not held over a compile or a wait)
    if (fd >= 0) {
      ::close(fd);
      if (exists(neff) && exists(done)) {
        ::unlink(lock.c_str());  // finished while we looked: read it on the next turn
        continue;
      }
      fmt::print(stderr, "{} Compiling {}\n", k_wrapper_tag, g.entry);
      GraphResult r = compile_here(g, tmpl, flags);
      ::unlink(lock.c_str());
      return result(r);
    }
    if (errno != EEXIST) return result({Outcome::failed, 0, 0, sys_error("create", lock).message});
    waited = true;
    const double waiting = since(t0);
    if (opts.max_wait > 0 && waiting > opts.max_wait)
      return result({Outcome::failed, 0, 0, fmt::format("gave up after {:.0f} s waiting for {}", waiting, lock)});
    if (static_cast<int>(waiting / 60) > minutes_reported) {
      minutes_reported = static_cast<int>(waiting / 60);
      fmt::print(stderr, "{} Another process must be compiling {}, been waiting for: {} minutes\n", k_cache_tag,
                 fs::path(g.entry).filename().string(), minutes_reported);
    }
    sleep_for(opts.poll_seconds);
  }
}

}  // namespace neffcache::clientsim
