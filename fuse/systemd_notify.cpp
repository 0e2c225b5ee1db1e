#include "systemd_notify.hpp"

#include <dlfcn.h>

#include <cstdlib>

#include <fmt/format.h>
#include <systemd/sd-daemon.h>  // (the prototype only: the function is looked up at run time)

namespace neffcachefs {

namespace {
decltype(&::sd_notify) notify = nullptr;
}  // namespace

std::string prepare_systemd_notify() {
  if (!std::getenv("NOTIFY_SOCKET")) return {};
  void* lib = ::dlopen("libsystemd.so.0", RTLD_NOW | RTLD_LOCAL);
  void* function = lib ? ::dlsym(lib, "sd_notify") : nullptr;
  if (!function) {
    return fmt::format("NOTIFY_SOCKET is set (systemd started neffcachefs) but libsystemd's sd_notify cannot be "
                       "loaded ({}): install libsystemd0, or start neffcachefs without NOTIFY_SOCKET",
                       ::dlerror());
  }
  notify = reinterpret_cast<decltype(&::sd_notify)>(function);
  return {};
}

void notify_systemd(const std::string& state) {
  if (notify) notify(0, state.c_str());
}

}  // namespace neffcachefs
