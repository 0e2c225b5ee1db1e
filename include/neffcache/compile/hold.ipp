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

NEFFCACHE_DECL KeepAlive::KeepAlive(EntryHold& hold)
    : shared_(std::make_shared<Shared>(hold, hold.beat_every())) {
  std::thread([s = shared_] {
    std::unique_lock lk(s->mu);
    // Once lost, beating on could only fail again.
    while (!s->cv.wait_for(lk, s->every, [&] { return s->done; }) && !s->hold.lost()) (void)s->hold.beat();
  }).detach();
}

NEFFCACHE_DECL Result<void> KeepAlive::beat_now() {
  std::lock_guard lk(shared_->mu);
  return shared_->hold.beat();
}

NEFFCACHE_DECL KeepAlive::~KeepAlive() {
  {
    std::lock_guard lk(shared_->mu);  // after a beat under way
    shared_->done = true;
  }
  shared_->cv.notify_all();
}

}  // namespace neffcache
