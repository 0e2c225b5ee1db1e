// The wall clock, behind an interface so that staleness, deadlines and scheduling can
// be tested without sleeping.
#pragma once

#include <chrono>

namespace neffcache {

// now() may be called from any thread at any time.
class Clock {
 public:
  using time_point = std::chrono::system_clock::time_point;
  virtual ~Clock() = default;
  virtual time_point now() const = 0;
};

class SystemClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::system_clock::now(); }
};

inline const Clock& system_clock() {
  static const SystemClock clock;
  return clock;
}

}  // namespace neffcache
