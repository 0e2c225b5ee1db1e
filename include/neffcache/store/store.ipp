// Definitions of store/store.hpp (core/decl.hpp).
#pragma once

#include <neffcache/store/store.hpp>

#include <unistd.h>

#include <fmt/format.h>

namespace neffcache::store {

NEFFCACHE_DECL LocalFile::~LocalFile() {
  if (kind_ == Kind::temporary_copy) ::unlink(path_.c_str());
}

NEFFCACHE_DECL Result<Entry> Store::at(std::string_view path) const {
  if (!is_entry_path(path))
    return Error{Errc::invalid_argument,
                 fmt::format("{}: not an entry path (neuronxcc-*/MODULE_*, or an LNL key of 32 hex digits)", path)};
  return Entry(this, std::string(path));
}

NEFFCACHE_DECL Result<Entry> Store::of_folder(const std::string& dir) const {
  return Error{Errc::invalid_argument, fmt::format("{}: {} has no local folders", dir, name())};
}

}  // namespace neffcache::store
