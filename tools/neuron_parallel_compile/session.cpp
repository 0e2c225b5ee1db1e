// The graphs of a trial run and their compiles (session.hpp).
#include "neuron_parallel_compile/session.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <neffcache/store/open.hpp>
#include <neffcache/store/scheduling.hpp>

#include "common/progress.hpp"
#include "neffcache/cmd_compile.hpp"
#include "neffcache/common.hpp"
#include "neuron_parallel_compile/say.hpp"
#include "neuron_parallel_compile/schedule.hpp"

namespace neffcache::npc {

Result<const store::Store*> Session::cache() {
  if (!cache_) {
    const std::string logged = cache_from_log(files_.cache_log);
    auto c = store::open_store(logged);
    if (!c) return Error{c.error().code, logged.empty() ? c.error().message
                                                        : fmt::format("the cache the trial run used: {}", c.error().message)};
    cache_ = std::move(*c);
    if (!logged.empty()) debug(fmt::format("the trial run used the cache {}", logged));
  }
  return cache_.get();
}

Result<bool> Session::overlapped() {
  auto c = cache();
  if (!c) return c.error();
  return args_.command == "collect-and-compile" && !(*c)->compiles_on_open();
}

Result<void> Session::add(const std::string& path) {
  auto c = cache();
  if (!c) return c.error();
  auto entry = (*c)->named_by_file(path);
  if (!entry) {
    warn(fmt::format("{} is not a graph of the cache {} ({}); it is left out", path, (*c)->name(),
                     entry.error().message));
    return {};
  }
  if (std::find(graphs_.begin(), graphs_.end(), *entry) != graphs_.end()) return {};
  graphs_.push_back(*entry);
  auto overlap = overlapped();
  if (!overlap) return overlap.error();
  if (!*overlap) return {};
  if (!batch_)
    if (auto b = start_batch(**c); !b) return b;
  // Another node's graph waits for the end of the trial run: ours go first.
  const Priority share = dynamic_share(entry->path(), node_plan(args_));
  debug(fmt::format("{}: {}", entry->path(), share == Priority::background ? "this node's share" : "another node's share"));
  if (share == Priority::background) batch_->add(entry->view());
  else later_.push_back(*entry);
  return {};
}

std::vector<std::string> Session::graphs() const {
  std::vector<std::string> out;
  for (const auto& e : graphs_) out.push_back(e.path());
  return out;
}

Result<int> Session::finish(const std::chrono::steady_clock::time_point t0) {
  auto c = cache();
  if (!c) return c.error();
  if (!batch_)
    if (auto b = start_batch(**c); !b) return b.error();
  const auto plan = node_plan(args_);
  for (const auto& e : later_) batch_->add(e.view(), Priority::deferred);
  auto entries = (*c)->list(store::IfMissing::empty);  // a run that extracted nothing made no folder
  if (!entries) return entries.error();
  for (const auto& e : *entries)
    if (e.state == EntryState::pending || e.state == EntryState::partial || e.state == EntryState::stale_lock)
      batch_->add((*c)->entry(e).view(), dynamic_share(e.path, plan));
  tools::ProgressDisplay display;
  while (!batch_->wait_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(250)))
    display.update(batch_->counts());
  display.finish(batch_->counts());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto items = batch_->items();
  auto report = neuron_report(items, start_, seconds);
  tools::print_failures(items);
  tools::print_neuron_report(stdout, report);
  tools::dump_report(report, seconds);
  return tools::failed_exit_status(report["compilation_summary"].value("false", std::size_t{0}));
}

Result<void> Session::start_batch(const store::Store& c) {
  cli::CompileOptions copts;
  copts.jobs = args_.num_parallel;
  copts.compiler = args_.compiler;
  copts.mem_budget = args_.mem_budget;
  copts.mem_ledger = args_.mem_ledger;
  auto env = cli::compiler_flags({});
  if (!env) return env.error();
  auto so = cli::scheduler_options(copts, *env, /*need_compiler=*/true);
  if (!so) return so.error();
  store::compile_through(c, *so);
  if (tools::logs(tools::LogLevel::info)) fmt::print(stderr, "INFO ||NEURON_CACHE||: Compile cache path: {}\n", c.name());
  cli::catch_up_index(c, env->compiler_flags);
  batch_ = std::make_unique<Batch>(std::move(*so), env->compiler_flags);
  return {};
}

}  // namespace neffcache::npc
