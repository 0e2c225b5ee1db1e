// An S3 client for the cache's needs, over libcurl with our own SigV4 signing:
// HEAD/GET/PUT/DELETE of objects, listing, conditional writes (If-None-Match: *,
// If-Match), streaming to and from files, multipart uploads for large files, and
// retries with exponential backoff and jitter on 5xx, SlowDown, timeouts and cut
// connections. Works with AWS and S3-compatible stores (radosgw, MinIO) through an
// endpoint override.
//
// Configuration comes from the environment, as the AWS tools read it:
//   endpoint   AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com
//   region     AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else us-east-1
//   addressing NEFFCACHE_S3_ADDRESSING=path|virtual; default virtual-host on AWS (path for
//              bucket names with dots), path-style on an overridden endpoint
//   credentials (first found) AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN);
//              the AWS_PROFILE (or default) profile of AWS_SHARED_CREDENTIALS_FILE
//              (~/.aws/credentials); the EC2 instance metadata service (IMDSv2) at
//              AWS_EC2_METADATA_SERVICE_ENDPOINT (default http://169.254.169.254), unless
//              AWS_EC2_METADATA_DISABLED=true.//
// The pieces: s3/http.hpp (curl pool, one exchange, retryable failures),
// s3/credentials.hpp (settings and credentials), s3/detail/sigv4.hpp (signing).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/s3/detail/sigv4.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/cache/url.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/s3/credentials.hpp>
#include <neffcache/s3/http.hpp>

namespace neffcache {

// The key of `rel` under the cache's key prefix `prefix` (none when empty).
NEFFCACHE_DECL std::string s3_key(const std::string& prefix, std::string_view rel);

struct ObjectInfo {
  std::string key;
  std::uint64_t size = 0;
  std::string etag;  // without quotes
  std::chrono::system_clock::time_point modified{};
};

// A small object read whole, with the server's clock at the moment it answered (its
// Date header): judging ages by the server's clock makes host clocks irrelevant.
struct ObjectBytes {
  ObjectInfo info;
  std::string bytes;
  std::chrono::system_clock::time_point server_time{};
};

// What a listing with a delimiter returns: the objects directly under the prefix and
// the "folders" (common prefixes, each ending with the delimiter).
struct Listing {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> prefixes;
};

// Conditions on a PUT: create only if absent, or replace only the version with an ETag.
struct PutCondition {
  bool if_absent = false;
  std::string if_match = {};  // an ETag, quoted or not
};
namespace detail {

// <Error><Code>X</Code><Message>Y</Message></Error>: the code and message, if any.
NEFFCACHE_DECL std::pair<std::string, std::string> s3_error_fields(const std::string& xml);

// One page of a ListObjectsV2 answer; nullopt when it is not one.
struct ListingPage {
  Listing listing;
  std::string next_token;  // empty on the last page
};

NEFFCACHE_DECL std::optional<ListingPage> parse_listing(std::string_view xml);
}  // namespace detail

// One bucket of an S3 store. Thread-safe: calls may run from many threads at once.
class S3Client {
 public:
  // Credentials are looked up now (environment, profile, then instance metadata); an
  // error says where it looked.
  static Result<std::unique_ptr<S3Client>> open(const CacheUrl& url, const EnvLookup& env = process_env);

  S3Client(std::string bucket, S3Settings settings, S3Credentials creds)
      : S3Client(std::move(bucket), std::move(settings)) {
    creds_ = std::move(creds);
  }

  const std::string& bucket() const { return bucket_; }
  const S3Settings& settings() const { return settings_; }

  // A client of the same bucket and credentials whose every request ends within a bound
  // (5 s a try, two tries): for the questions a waiting client's request asks, which must
  // neither hang nor wait out the retries a transfer deserves.
  NEFFCACHE_DECL std::unique_ptr<S3Client> quick();
  std::string describe(std::string_view key) const;

 private:
  static Result<std::unique_ptr<S3Client>> open_unnamed(const CacheUrl& url, const EnvLookup& env);

 public:

  Result<ObjectInfo> head(const std::string& key) {
    auto r = request({.method = "HEAD", .key = key});
    if (!r) return r.error();
    return info_from(key, *r);
  }

  // A small object's bytes (a flags file, a lease, a marker).
  Result<std::string> get(const std::string& key) {
    auto r = request({.method = "GET", .key = key});
    if (!r) return r.error();
    return std::move(r->body);
  }

  Result<ObjectBytes> get_with_info(const std::string& key);

  // Streams the object into `path` through a temporary file beside it, fsynced and
  // renamed: `path` is the whole object or untouched. With FileSync::later the file is not
  // fsynced: the caller makes it durable (syncfs) before anything relies on it.
  enum class FileSync { now, later };
  Result<ObjectInfo> download(const std::string& key, const std::string& path,
                              const std::optional<detail::FileOwner>& owner = {}, FileSync sync = FileSync::now);

  // Writes a small object. A failed condition is Errc::precondition_failed.
  Result<ObjectInfo> put(const std::string& key, std::string_view bytes, const PutCondition& cond = {});

  // Uploads a regular file, streaming it; in parts above the multipart threshold. The
  // object appears whole or not at all: a failed multipart upload is aborted.
  Result<ObjectInfo> upload(const std::string& key, const std::string& path, const PutCondition& cond = {});

  // upload() of the first `size` bytes of the regular file open as `fd` (read from its
  // start, whatever its offset; the caller keeps it), for a file opened with care.
  Result<ObjectInfo> upload_fd(const std::string& key, int fd, std::uint64_t size, const PutCondition& cond = {});

  // Copies the object `from` to `to` inside the bucket (CopyObject: no byte passes through
  // this host), only while `from` has the ETag `if_match` when one is given, so that what
  // is copied is the very object the caller checked. One request copies at most 5 GiB
  // (S3's limit), which no NEFF reaches. Returns the copy's ETag; a failed condition is
  // Errc::precondition_failed. A server that ignores the condition (radosgw 16 does, Ceph
  // tracker 40808) is caught where the ETags tell: an object uploaded in one part keeps
  // its MD5 as its ETag, so a copy with another ETag is of another version, and is
  // removed again.
  Result<std::string> copy(const std::string& from, const std::string& to, std::string_view if_match = {});

  // Deletes an object; an absent one is fine (S3 answers 204 either way).
  Result<void> remove(const std::string& key) {
    auto r = request({.method = "DELETE", .key = key});
    if (!r && r.error().code != Errc::not_found) return r.error();
    return {};
  }

  // Lists the keys under `prefix`, every page. With a delimiter ("/"), keys below the
  // next delimiter are folded into prefixes. With `max_keys`, only the first page of at
  // most that many (enough to tell whether anything is there).
  Result<Listing> list(const std::string& prefix, std::string_view delimiter = {}, std::size_t max_keys = 0);

  // Creates the bucket (for tests and first set-up); an existing bucket of ours is fine.
  Result<void> create_bucket() {
    auto r = request({.method = "PUT", .key = {}, .bucket_only = true});
    if (!r && r.error().message.find("BucketAlreadyOwnedByYou") == std::string::npos) return r.error();
    return {};
  }

  // Counts of what the client did, for tests and statistics.
  std::uint64_t retries() const { return retries_.load(); }
  // Every HTTP request sent (retries too), and those that failed: no answer, or an HTTP
  // error other than 404 and 412, which answer a question (is it there, is it unchanged).
  std::uint64_t requests() const { return requests_.load(); }
  std::uint64_t request_errors() const { return request_errors_.load(); }

 private:
  struct Call {
    std::string method = {};
    std::string key = {};
    detail::NameValues query = {};
    detail::NameValues headers = {};
    std::string_view body = {};
    int body_fd = -1;
    std::uint64_t body_offset = 0;
    std::uint64_t body_size = 0;
    int sink_fd = -1;
    bool bucket_only = false;
  };

  S3Client(std::string bucket, S3Settings settings) : bucket_(std::move(bucket)), settings_(std::move(settings)) {}

  static void add_condition(Call& c, const PutCondition& cond) {
    if (cond.if_absent) c.headers.emplace_back("If-None-Match", "*");
    // radosgw 16 compares If-Match against the bare ETag; AWS accepts both forms.
    if (!cond.if_match.empty()) c.headers.emplace_back("If-Match", detail::unquote(cond.if_match));
  }

  ObjectInfo info_from(const std::string& key, const detail::HttpReply& r) const;

  Result<S3Credentials> credentials();

  // Host and path for a key, by the addressing style.
  std::pair<std::string, std::string> locate(const Call& c) const;

  // One request with signing and retries. Non-2xx statuses become errors that say what
  // the server said.
  Result<detail::HttpReply> request(Call c);

  Error status_error(const Call& c, long status, const std::string& code, const std::string& message, int tries,
                     const std::string& source) const;

  Result<ObjectInfo> upload_parts(const std::string& key, int fd, std::uint64_t size, const PutCondition& cond);

  std::string bucket_;
  S3Settings settings_;
  detail::CurlPool pool_;
  std::mutex creds_mu_;
  S3Credentials creds_;
  bool refreshable_ = false;
  std::atomic<std::uint64_t> retries_{0};
  std::atomic<std::uint64_t> requests_{0};
  std::atomic<std::uint64_t> request_errors_{0};
};

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/client.ipp>
#endif
