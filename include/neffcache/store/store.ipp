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

NEFFCACHE_DECL Result<std::unique_ptr<Destination>> Store::destination(const Entry& e) const {
  return Error{Errc::invalid_argument, fmt::format("{}: {} compiles its entries through its scheduler only",
                                                   e.path(), name())};
}

NEFFCACHE_DECL Result<IndexUpdate> Store::update_index(bool, const std::vector<std::string>&) const {
  return Error{Errc::invalid_argument, fmt::format("{}: this cache keeps no content index", name())};
}

NEFFCACHE_DECL Result<void> Store::record_result(const Entry&, const ContentId&, double) const {
  return Error{Errc::invalid_argument, fmt::format("{}: this cache keeps no content index", name())};
}

NEFFCACHE_DECL Result<void> Store::copy_file(const Entry& e, std::string_view name, const std::string& to) const {
  auto local = local_file(e, name);
  if (!local) return local.error();
  auto in = detail::open_regular(local->path());
  if (!in) return in.error();
  // (Synced, as a copy of a cache's file always was.)
  return detail::copy_into_place(in->get(), local->path(), to, {}, detail::Durable::yes);
}

NEFFCACHE_DECL std::string Store::state_dir() const {
  return fmt::format("{}/.cache/neffcache", detail::getenv_or("HOME", "/root"));
}

NEFFCACHE_DECL Result<Entry> Store::of_folder(const std::string& dir) const {
  return Error{Errc::invalid_argument, fmt::format("{}: {} has no local folders", dir, name())};
}

}  // namespace neffcache::store
