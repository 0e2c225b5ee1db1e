// The entry lock on S3: a lease object, so that a compile runs on one host at a time
// across every host that shares a bucket, and a host that dies never wedges an entry.
//
// The lease is the entry's lock object (model.hlo_module.pb.lock) holding an owner
// record and a time to live. Every change to it is a conditional write, so the server
// decides every race:
//   acquire   PUT If-None-Match: *. If the object exists: read it; ours (a retried
//             create that had succeeded) is held; released or expired is taken over by
//             PUT If-Match: <its ETag>, which exactly one contender wins; else busy.
//   renew     PUT If-Match: <our ETag>, which moves Last-Modified forward. A 412 means
//             the lease expired and another host took it: the holder has lost it.
//   release   PUT If-Match: <our ETag> of a record marked released, which anyone may
//             take over at once.
// Expiry is judged by the server's clock only (the lease's Last-Modified against the
// Date of the answer that read it), so clock skew between hosts does not matter. A
// holder renews every ttl/4; one that cannot reach the server for a whole ttl (a crash,
// a partition) loses the lease, and it learns so at its next renewal.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/detail/proc.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/s3/client.hpp>

namespace neffcache {

inline constexpr std::chrono::seconds k_default_lease_ttl{60};
// A lease record with a longer ttl is not ours: an hour's compile renews every 15 s.
inline constexpr std::chrono::seconds k_max_lease_ttl{86400};

struct LeaseRecord {
  std::string host;
  int64_t pid = 0;
  std::string instance;  // random per acquisition
  std::chrono::seconds ttl{k_default_lease_ttl};
  bool released = false;
  // Counts the writes of one holding. Every write must change the bytes, hence the
  // ETag: a contender that read the lease just before a renewal must not match it.
  uint64_t seq = 0;
};

// A lease as a reader finds it.
struct LeaseInfo {
  std::optional<LeaseRecord> record;  // none if the object is not a lease record (foreign lock)
  std::string etag;
  std::chrono::seconds age{0};  // since its last write, by the server's clock
  bool expired = false;         // released, past its ttl, or unreadable and past the default ttl
};

namespace detail {

inline std::string lease_json(const LeaseRecord& r) {
  nlohmann::ordered_json j{{"neffcache_lease", 1}, {"host", r.host},          {"pid", r.pid},
                           {"instance", r.instance}, {"ttl_seconds", r.ttl.count()}, {"released", r.released},
                           {"seq", r.seq}};
  return j.dump() + "\n";
}

inline std::optional<LeaseRecord> parse_lease(std::string_view text) {
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

inline LeaseInfo judge_lease(const ObjectBytes& o) {
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

// Reads the lease at `key`. Errc::not_found when there is none.
inline Result<LeaseInfo> read_lease(S3Client& s3, const std::string& key) {
  auto o = s3.get_with_info(key);
  if (!o) return o.error();
  return detail::judge_lease(*o);
}

// A held lease. Move-only; not released by the destructor (a crashed holder is the
// case the ttl exists for, and release needs the network): call finish() or release().
// One thread at a time.
class S3Lease {
 public:
  // What its holder leaves the entry as, when it gives the lease back (finish).
  enum class Entry {
    settled,  // done, or as it was before anyone locked it: no one needs the lease again
    open,     // still to compile, or failed: the next taker may compile it
  };

  // Takes the lease at `key` or says who holds it (Errc::busy). `host` names us in the
  // record (default: this machine's name).
  static Result<S3Lease> acquire(S3Client& s3, const std::string& key,
                                 std::chrono::seconds ttl = k_default_lease_ttl, std::string host = {}) {
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

  // Extends the lease by its ttl. Errc::precondition_failed: it was lost (expired and
  // taken over, or its object removed: by a holder that took it over and is through, or
  // by a removal of the entry); the holder must stop and publish nothing. (A conditional
  // write to a removed object is refused with 412 by radosgw, 404 by AWS S3.)
  Result<void> renew() {
    ++record_.seq;
    auto r = s3_->put(key_, detail::lease_json(record_), {.if_match = etag_});
    if (!r) {
      if (r.error().code == Errc::precondition_failed || r.error().code == Errc::not_found) {
        lost_ = true;
        return Error{Errc::precondition_failed,
                     fmt::format("{}: lease lost: it expired and another host took it over, or it was removed",
                                 s3_->describe(key_))};
      }
      return r.error();
    }
    etag_ = r->etag;
    return {};
  }

  // Gives the lease up: anyone may take it at once. A lease already lost is fine.
  Result<void> release() {
    LeaseRecord done = record_;
    done.released = true;
    ++done.seq;
    auto r = s3_->put(key_, detail::lease_json(done), {.if_match = etag_});
    if (!r && r.error().code != Errc::precondition_failed) return r.error();
    return {};
  }

  // Gives the lease back once its holder is through: for a settled entry its object is
  // deleted (released if the delete fails), for an open one it is released. A lease a
  // renewal found lost is someone else's object now: left alone (a delete is not
  // conditional).
  void finish(Entry entry) {
    if (lost_) return;
    if (entry == Entry::settled && s3_->remove(key_)) return;
    (void)release();
  }

  // A renewal found it taken over or removed: publish nothing under it.
  bool lost() const { return lost_; }
  const std::string& key() const { return key_; }
  const LeaseRecord& record() const { return record_; }
  std::chrono::seconds renew_interval() const { return std::max(std::chrono::seconds(1), record_.ttl / 4); }

 private:
  S3Lease(S3Client& s3, std::string key, LeaseRecord record, std::string etag)
      : s3_(&s3), key_(std::move(key)), record_(std::move(record)), etag_(std::move(etag)) {}

  S3Client* s3_;
  std::string key_;
  LeaseRecord record_;
  std::string etag_;
  bool lost_ = false;  // a renewal found it taken over
};

}  // namespace neffcache
