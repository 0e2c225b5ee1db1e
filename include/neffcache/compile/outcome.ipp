// Definitions of compile/outcome.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/outcome.hpp>

#include <utility>

namespace neffcache {

NEFFCACHE_DECL const char* to_string(CompileOutcome o) {
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

NEFFCACHE_DECL CompileResult CompileResult::of(CompileOutcome o, std::string message) {
  CompileResult r;
  r.outcome = o;
  r.message = std::move(message);
  return r;
}

namespace detail {

NEFFCACHE_DECL std::optional<std::string_view> resource_exhaustion(std::string_view output) {
  for (std::string_view mark :
       {"No space left on device", "Disk quota exceeded", "Cannot allocate memory", "MemoryError", "std::bad_alloc"})
    if (output.find(mark) != std::string_view::npos) return mark;
  return std::nullopt;
}

}  // namespace detail

}  // namespace neffcache
