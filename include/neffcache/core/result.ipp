// Definitions of core/result.hpp (core/decl.hpp).
#pragma once

#include <neffcache/core/result.hpp>

#include <cstring>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL const char* to_string(Errc c) {
  switch (c) {
    case Errc::invalid_argument: return "invalid argument";
    case Errc::bad_hlo: return "bad HLO";
    case Errc::bad_flags_file: return "bad compile_flags.json";
    case Errc::io: return "I/O error";
    case Errc::not_found: return "not found";
    case Errc::busy: return "busy";
    case Errc::timed_out: return "timed out";
    case Errc::denied: return "denied";
    case Errc::precondition_failed: return "precondition failed";
    case Errc::exists: return "exists";
  }
  return "error";
}

NEFFCACHE_DECL Error sys_error(std::string_view op, std::string_view what, int err) {
  return Error{err == ENOENT ? Errc::not_found : Errc::io,
               fmt::format("{} {}: {}", op, what, std::strerror(err)), err};
}

}  // namespace neffcache
