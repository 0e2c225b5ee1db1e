#include "systemd_notify.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
#include <systemd/sd-daemon.h>  // (the prototype only: the function is looked up at run time)

namespace neffcachefs {

void notify_systemd(const std::string& state) {
  using Notify = decltype(&::sd_notify);
  static const Notify notify = []() -> Notify {
    if (!std::getenv("NOTIFY_SOCKET")) return nullptr;
    void* lib = ::dlopen("libsystemd.so.0", RTLD_NOW | RTLD_LOCAL);
    void* function = lib ? ::dlsym(lib, "sd_notify") : nullptr;
    if (!function) {
      // A unit of Type=notify waits for READY=1 until its start times out: say why.
      fmt::print(stderr, "neffcachefs: error: NOTIFY_SOCKET is set but libsystemd's sd_notify cannot be loaded ({}): "
                         "systemd will not learn that the mount is ready\n", ::dlerror());
      return nullptr;
    }
    return reinterpret_cast<Notify>(function);
  }();
  if (notify) notify(0, state.c_str());
}

}  // namespace neffcachefs
