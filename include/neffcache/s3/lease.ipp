// Definitions of s3/lease.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/lease.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::string lease_json(const LeaseRecord& r) {
  nlohmann::ordered_json j{{"neffcache_lease", 1}, {"host", r.host},          {"pid", r.pid},
                           {"instance", r.instance}, {"ttl_seconds", r.ttl.count()}, {"released", r.released},
                           {"seq", r.seq}};
  return j.dump() + "\n";
}

NEFFCACHE_DECL std::optional<LeaseRecord> parse_lease(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("neffcache_lease")) return std::nullopt;
  // Integers only: a number beyond 64 bits parses as a float, and converting that to an
  // integer is undefined (the fuzzer found one).
  for (const char* k : {"pid", "ttl_seconds", "seq"})
    if (!j.contains(k) || !j[k].is_number_integer()) return std::nullopt;
  try {
    LeaseRecord r;
    r.host = j.at("host").get<std::string>();
    r.pid = j.at("pid").get<int64_t>();
    r.instance = j.at("instance").get<std::string>();
    r.ttl = std::chrono::seconds(j.at("ttl_seconds").get<int64_t>());
    r.released = j.at("released").get<bool>();
    r.seq = j.at("seq").get<uint64_t>();
    // Within bounds, so that time arithmetic on it cannot overflow.
    if (r.ttl < std::chrono::seconds(0) || r.ttl > k_max_lease_ttl) return std::nullopt;
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

NEFFCACHE_DECL LeaseInfo judge_lease(const ObjectBytes& o) {
  LeaseInfo info;
  info.record = parse_lease(o.bytes);
  info.etag = o.info.etag;
  auto age = std::chrono::duration_cast<std::chrono::seconds>(o.server_time - o.info.modified);
  info.age = std::max(age, std::chrono::seconds(0));
  auto ttl = info.record ? info.record->ttl : k_default_lease_ttl;
  // Both clocks are the server's, to the second: strictly past the ttl to be sure.
  info.expired = (info.record && info.record->released) || info.age > ttl;
  return info;
}

}  // namespace detail

NEFFCACHE_DECL Result<S3Lease> S3Lease::acquire(S3Client& s3, const std::string& key, std::chrono::seconds ttl,
                                                std::string host) {
  LeaseRecord mine;
  auto self = detail::current_process();
  mine.host = host.empty() ? self.host : std::move(host);
  mine.pid = self.pid;
  mine.instance = detail::random_hex64();
  mine.ttl = ttl;
  std::string body = detail::lease_json(mine);
  for (int round = 0; round < 8; ++round) {
    auto created = s3.put(key, body, {.if_absent = true});
    if (created) return S3Lease(s3, key, mine, created->etag);
    if (created.error().code != Errc::precondition_failed) return created.error();
    auto found = read_lease(s3, key);
    if (!found && found.error().code == Errc::not_found) continue;  // released and deleted meanwhile
    if (!found) return found.error();
    // Our own create, whose answer was lost and whose retry then saw it.
    if (found->record && found->record->instance == mine.instance) return S3Lease(s3, key, mine, found->etag);
    if (!found->expired) {
      std::string who = found->record ? fmt::format("{} (pid {})", found->record->host, found->record->pid)
                                      : std::string("a lock object that is not ours");
      auto ttl_left = (found->record ? found->record->ttl : k_default_lease_ttl) - found->age;
      return Error{Errc::busy, fmt::format("{}: leased by {}, renewed {} s ago, expires in {} s at the latest",
                                           s3.describe(key), who, found->age.count(), ttl_left.count())};
    }
    auto taken = s3.put(key, body, {.if_match = found->etag});
    if (taken) return S3Lease(s3, key, mine, taken->etag);
    if (taken.error().code != Errc::precondition_failed && taken.error().code != Errc::not_found)
      return taken.error();
    // Someone else took it over or renewed it first: look again.
  }
  return Error{Errc::busy, fmt::format("{}: the lease keeps changing hands", s3.describe(key))};
}

NEFFCACHE_DECL Result<void> S3Lease::renew() {
  for (int round = 0; round < 2; ++round) {
    ++record_.seq;
    auto r = s3_->put(key_, detail::lease_json(record_), {.if_match = etag_});
    if (r) {
      etag_ = r->etag;
      return {};
    }
    if (r.error().code != Errc::precondition_failed && r.error().code != Errc::not_found) return r.error();
    // A write of ours whose answer never came (lost, or past its time) may have changed the
    // ETag, and a retry then met the new one: while the lease holds our instance, not
    // released, it is ours still, and is renewed from what it holds.
    auto found = read_lease(*s3_, key_);
    if (!found && found.error().code != Errc::not_found) return found.error();  // not known: asked again next time
    if (!found || !found->record || found->record->instance != record_.instance || found->record->released) {
      lost_ = true;
      return Error{Errc::precondition_failed,
                   fmt::format("{}: lease lost: it expired and another host took it over, or it was removed",
                               s3_->describe(key_))};
    }
    etag_ = found->etag;
    record_.seq = found->record->seq;
  }
  return Error{Errc::io, fmt::format("{}: the lease changed under each renewal", s3_->describe(key_))};
}

NEFFCACHE_DECL Result<void> S3Lease::release() {
  LeaseRecord done = record_;
  done.released = true;
  ++done.seq;
  auto r = s3_->put(key_, detail::lease_json(done), {.if_match = etag_});
  if (!r && r.error().code != Errc::precondition_failed) return r.error();
  return {};
}

}  // namespace neffcache
