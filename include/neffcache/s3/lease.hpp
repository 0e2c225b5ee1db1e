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

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <neffcache/core/decl.hpp>
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

NEFFCACHE_DECL std::string lease_json(const LeaseRecord& r);

NEFFCACHE_DECL std::optional<LeaseRecord> parse_lease(std::string_view text);

NEFFCACHE_DECL LeaseInfo judge_lease(const ObjectBytes& o);

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
                                 std::chrono::seconds ttl = k_default_lease_ttl, std::string host = {});

  // Extends the lease by its ttl. Errc::precondition_failed: it was lost (expired and
  // taken over, or its object removed: by a holder that took it over and is through, or
  // by a removal of the entry); the holder must stop and publish nothing. (A conditional
  // write to a removed object is refused with 412 by radosgw, 404 by AWS S3.)
  Result<void> renew();

  // Gives the lease up: anyone may take it at once. A lease already lost is fine.
  Result<void> release();

  // Gives the lease back once its holder is through: for a settled entry its object is
  // deleted (released if the delete fails), for an open one it is released. A lease a
  // renewal found lost is someone else's object now: left alone (a delete is not
  // conditional).
  void finish(Entry entry) {
    if (lost_) return;
    if (entry == Entry::settled && s3_->remove(key_)) return;
    (void)release();
  }

  // Its later requests (renewals, its release) go through `s3`, a client of the same
  // bucket: a lease taken within a bound (S3Client::quick) is then kept with the retries a
  // holder needs.
  void use(S3Client& s3) { s3_ = &s3; }
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

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/lease.ipp>
#endif
