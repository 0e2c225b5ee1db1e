// Definitions of compile/hold.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/hold.hpp>

namespace neffcache {

NEFFCACHE_DECL Result<void> EntryHold::beat() {
  auto r = refresh();
  if (!r && gone(r.error())) {
    std::lock_guard lk(mu_);
    why_ = r.error().message;
    lost_ = true;
  }
  return r;
}

NEFFCACHE_DECL std::string EntryHold::lost_why() const {
  std::lock_guard lk(mu_);
  return why_;
}

NEFFCACHE_DECL KeepAlive::KeepAlive(EntryHold& hold) : hold_(hold) {
  thread_ = std::thread([this] {
    std::unique_lock lk(mu_);
    // Once lost, beating on could only fail again.
    while (!cv_.wait_for(lk, hold_.beat_every(), [&] { return done_; }) && !hold_.lost()) (void)hold_.beat();
  });
}

NEFFCACHE_DECL Result<void> KeepAlive::beat_now() {
  std::lock_guard lk(mu_);
  return hold_.beat();
}

NEFFCACHE_DECL KeepAlive::~KeepAlive() {
  {
    std::lock_guard lk(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace neffcache
