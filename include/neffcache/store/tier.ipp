// Definitions of store/tier.hpp (core/decl.hpp).
#pragma once

#include <neffcache/store/tier.hpp>

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache::store {

NEFFCACHE_DECL Result<std::unique_ptr<TierStore>> TierStore::open(const CacheUrl& url, S3Tier::Options o,
                                                                  const EnvLookup& env) {
  auto remote = S3Store::open(url, env);
  if (!remote) return remote.error();
  auto client = S3Client::open(url, env);
  if (!client) return client.error();
  o.prefix = url.prefix;
  (*remote)->set_compile_options(o.compile);
  std::string root = o.root;
  auto tier = std::make_shared<S3Tier>(std::move(*client), std::move(o));
  return std::unique_ptr<TierStore>(new TierStore(std::move(*remote), std::move(tier), std::move(root)));
}

NEFFCACHE_DECL std::string TierStore::peaks_dir() const { return fmt::format("{}/{}", root_, k_peaks_dir); }

NEFFCACHE_DECL Result<Entry> TierStore::named(std::string_view arg) const {
  if (auto local = local_entry(arg)) return local;
  auto e = remote_->named(arg);
  if (!e) return e.error();
  return make_entry(e->path());
}

NEFFCACHE_DECL Result<Entry> TierStore::named_by_file(std::string_view path) const {
  if (auto local = local_entry(path)) return local;
  auto e = remote_->named_by_file(path);
  if (!e) return e.error();
  return make_entry(e->path());
}

NEFFCACHE_DECL std::string TierStore::view(const Entry& e) const { return fmt::format("{}/{}", root_, e.path()); }

NEFFCACHE_DECL Result<LocalFile> TierStore::local_file(const Entry& e, std::string_view name) const {
  std::string here = fmt::format("{}/{}", view(e), name);
  if (::access(here.c_str(), R_OK) == 0) return LocalFile(std::move(here), LocalFile::Kind::in_place);
  return remote_->local_file(on_s3(e), name);
}

NEFFCACHE_DECL Result<Entry> TierStore::of_folder(const std::string& dir) const {
  if (auto rel = entry_path_in(root_, dir)) return make_entry(*rel);
  return Error{Errc::invalid_argument, fmt::format("{}: not an entry of the local tier {}", dir, root_)};
}

NEFFCACHE_DECL bool TierRemote::fill(int dir, std::string_view name) const {
  return tier_->fill(neffcache::detail::path_of_fd(dir), name);
}

NEFFCACHE_DECL void TierRemote::fill_listing(int dir) const { tier_->fill_listing(neffcache::detail::path_of_fd(dir)); }

NEFFCACHE_DECL std::vector<std::string> TierRemote::names_elsewhere(int dir) const {
  return tier_->names_elsewhere(neffcache::detail::path_of_fd(dir));
}

NEFFCACHE_DECL bool TierRemote::held_elsewhere(int dir, std::string_view lock_name) const {
  return tier_->held_elsewhere(neffcache::detail::path_of_fd(dir), lock_name);
}

NEFFCACHE_DECL ClientHold TierRemote::hold_for_client(int dir, std::string_view lock_name) const {
  return tier_->hold_for_client(neffcache::detail::path_of_fd(dir), lock_name);
}

NEFFCACHE_DECL ClientHold TierRemote::hold_key_for_client(const std::string& entry_dir) const {
  return tier_->hold_for_client(entry_dir, k_lnl_lease_file);
}

NEFFCACHE_DECL void TierRemote::neff_opened(int neff) const {
  const std::string entry_dir = std::filesystem::path(neffcache::detail::path_of_fd(neff)).parent_path().string();
  if (auto e = store_.of_folder(entry_dir)) tier_->opened(store_.view(*e));
}

NEFFCACHE_DECL Result<void> TierRemote::publish_written(const std::string& entry_dir) const {
  auto e = store_.of_folder(entry_dir);
  if (!e) return e.error();
  return tier_->upload_written(store_.view(*e));
}

NEFFCACHE_DECL Result<void> TierRemote::promote(const std::string& folder, const std::string& to) const {
  auto e = store_.of_folder(to);
  if (!e || e->dialect() != Dialect::lnl) return {};
  return tier_->promote(folder, e->path());
}

NEFFCACHE_DECL std::optional<nlohmann::ordered_json> TierRemote::counters() const { return tier_->stats(); }

NEFFCACHE_DECL Result<Entry> TierStore::local_entry(std::string_view arg) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(arg), ec).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  if (!is_entry_folder(p.filename().string())) p = p.parent_path();
  return of_folder(p.string());
}

}  // namespace neffcache::store
