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

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <curl/curl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tinyxml2.h>

#include <neffcache/core/detail/fs.hpp>
#include <neffcache/s3/detail/sigv4.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/cache/url.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/s3/credentials.hpp>
#include <neffcache/s3/http.hpp>

namespace neffcache {

// The key of `rel` under the cache's key prefix `prefix` (none when empty).
inline std::string s3_key(const std::string& prefix, std::string_view rel) {
  return prefix.empty() ? std::string(rel) : fmt::format("{}/{}", prefix, rel);
}

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
inline std::pair<std::string, std::string> s3_error_fields(const std::string& xml) {
  tinyxml2::XMLDocument doc;
  if (xml.empty() || doc.Parse(xml.data(), xml.size()) != tinyxml2::XML_SUCCESS) return {};
  auto* root = doc.FirstChildElement("Error");
  if (!root) return {};
  auto text = [&](const char* name) {
    auto* e = root->FirstChildElement(name);
    return e && e->GetText() ? std::string(e->GetText()) : std::string();
  };
  return {text("Code"), text("Message")};
}

// One page of a ListObjectsV2 answer; nullopt when it is not one.
struct ListingPage {
  Listing listing;
  std::string next_token;  // empty on the last page
};

inline std::optional<ListingPage> parse_listing(std::string_view xml) {
  tinyxml2::XMLDocument doc;
  if (doc.Parse(xml.data(), xml.size()) != tinyxml2::XML_SUCCESS) return std::nullopt;
  auto* root = doc.FirstChildElement("ListBucketResult");
  if (!root) return std::nullopt;
  auto text = [](const tinyxml2::XMLElement* parent, const char* name) {
    auto* e = parent->FirstChildElement(name);
    return e && e->GetText() ? std::string(e->GetText()) : std::string();
  };
  ListingPage page;
  for (auto* e = root->FirstChildElement("Contents"); e; e = e->NextSiblingElement("Contents"))
    page.listing.objects.push_back(ObjectInfo{text(e, "Key"), std::strtoull(text(e, "Size").c_str(), nullptr, 10),
                                              unquote(text(e, "ETag")), parse_iso8601(text(e, "LastModified"))});
  for (auto* e = root->FirstChildElement("CommonPrefixes"); e; e = e->NextSiblingElement("CommonPrefixes"))
    page.listing.prefixes.push_back(text(e, "Prefix"));
  if (text(root, "IsTruncated") == "true") page.next_token = text(root, "NextContinuationToken");
  return page;
}
}  // namespace detail

// One bucket of an S3 store. Thread-safe: calls may run from many threads at once.
class S3Client {
 public:
  // Credentials are looked up now (environment, profile, then instance metadata); an
  // error says where it looked.
  static Result<std::unique_ptr<S3Client>> open(const CacheUrl& url, const EnvLookup& env = process_env) {
    auto r = open_unnamed(url, env);
    if (!r) return Error{r.error().code, fmt::format("{}: {}", url.text, r.error().message)};
    return r;
  }

  S3Client(std::string bucket, S3Settings settings, S3Credentials creds)
      : S3Client(std::move(bucket), std::move(settings)) {
    creds_ = std::move(creds);
  }

  const std::string& bucket() const { return bucket_; }
  const S3Settings& settings() const { return settings_; }
  std::string describe(std::string_view key) const { return fmt::format("s3://{}/{}", bucket_, key); }

 private:
  static Result<std::unique_ptr<S3Client>> open_unnamed(const CacheUrl& url, const EnvLookup& env) {
    auto settings = s3_settings_from_env(url.bucket, env);
    if (!settings) return settings.error();
    auto client = std::unique_ptr<S3Client>(new S3Client(url.bucket, std::move(*settings)));
    auto from_env = credentials_from_env(env);
    if (!from_env) return from_env.error();
    if (*from_env) {
      client->creds_ = **from_env;
      return client;
    }
    auto from_profile = credentials_from_profile(env);
    if (!from_profile) return from_profile.error();
    if (*from_profile) {
      client->creds_ = **from_profile;
      return client;
    }
    if (!client->settings_.imds_enabled)
      return Error{Errc::denied, "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                                 "or AWS_PROFILE (instance metadata is disabled)"};
    auto from_imds = credentials_from_imds(client->pool_, client->settings_.imds_endpoint);
    if (!from_imds)
      return Error{Errc::denied,
                   fmt::format("no S3 credentials: none in the environment or ~/.aws/credentials, and {}",
                               from_imds.error().message)};
    client->creds_ = std::move(*from_imds);
    client->refreshable_ = true;
    return client;
  }

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

  Result<ObjectBytes> get_with_info(const std::string& key) {
    auto r = request({.method = "GET", .key = key});
    if (!r) return r.error();
    ObjectBytes out{info_from(key, *r), std::move(r->body), detail::parse_http_date(r->header("date"))};
    return out;
  }

  // Streams the object into `path` through a temporary file beside it, fsynced and
  // renamed: `path` is the whole object or untouched.
  Result<ObjectInfo> download(const std::string& key, const std::string& path,
                              const std::optional<detail::FileOwner>& owner = {}) {
    std::random_device rd;
    std::string tmp = fmt::format("{}.neffcache-tmp.{:08x}", path, rd());
    detail::UniqueFd fd(sys::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) return sys_error("create", tmp);
    detail::give(fd.get(), owner);
    auto fail = [&](Error e) {
      sys::unlink(tmp.c_str());
      return e;
    };
    auto r = request({.method = "GET", .key = key, .sink_fd = fd.get()});
    if (!r) return fail(r.error());
    auto info = info_from(key, *r);
    if (r->sunk != info.size) return fail(Error{Errc::io, fmt::format("{}: got {} of {} bytes", describe(key), r->sunk, info.size)});
    if (sys::fsync(fd.get()) != 0) return fail(sys_error("fsync", tmp));
    fd.reset();
    if (sys::rename(tmp.c_str(), path.c_str()) != 0) return fail(sys_error("rename", path));
    return info;
  }

  // Writes a small object. A failed condition is Errc::precondition_failed.
  Result<ObjectInfo> put(const std::string& key, std::string_view bytes, const PutCondition& cond = {}) {
    Call c{.method = "PUT", .key = key, .body = bytes};
    add_condition(c, cond);
    auto r = request(std::move(c));
    if (!r) return r.error();
    return ObjectInfo{key, bytes.size(), detail::unquote(r->header("etag")), {}};
  }

  // Uploads a regular file, streaming it; in parts above the multipart threshold. The
  // object appears whole or not at all: a failed multipart upload is aborted.
  Result<ObjectInfo> upload(const std::string& key, const std::string& path, const PutCondition& cond = {}) {
    struct stat st {};
    auto fd = detail::open_regular(path, &st);
    if (!fd) return fd.error();
    return upload_fd(key, fd->get(), static_cast<std::uint64_t>(st.st_size), cond);
  }

  // upload() of the first `size` bytes of the regular file open as `fd` (read from its
  // start, whatever its offset; the caller keeps it), for a file opened with care.
  Result<ObjectInfo> upload_fd(const std::string& key, int fd, std::uint64_t size, const PutCondition& cond = {}) {
    if (size > settings_.multipart_threshold) return upload_parts(key, fd, size, cond);
    Call c{.method = "PUT", .key = key, .body_fd = fd, .body_size = size};
    add_condition(c, cond);
    auto r = request(std::move(c));
    if (!r) return r.error();
    return ObjectInfo{key, size, detail::unquote(r->header("etag")), {}};
  }

  // Deletes an object; an absent one is fine (S3 answers 204 either way).
  Result<void> remove(const std::string& key) {
    auto r = request({.method = "DELETE", .key = key});
    if (!r && r.error().code != Errc::not_found) return r.error();
    return {};
  }

  // Lists the keys under `prefix`, every page. With a delimiter ("/"), keys below the
  // next delimiter are folded into prefixes. With `max_keys`, only the first page of at
  // most that many (enough to tell whether anything is there).
  Result<Listing> list(const std::string& prefix, std::string_view delimiter = {}, std::size_t max_keys = 0) {
    Listing out;
    std::string token;
    for (;;) {
      detail::NameValues q{{"list-type", "2"}, {"prefix", prefix}};
      if (!delimiter.empty()) q.emplace_back("delimiter", std::string(delimiter));
      if (max_keys > 0) q.emplace_back("max-keys", std::to_string(max_keys));
      if (!token.empty()) q.emplace_back("continuation-token", token);
      auto r = request({.method = "GET", .query = std::move(q)});
      if (!r) return r.error();
      auto page = detail::parse_listing(r->body);
      if (!page) return Error{Errc::io, fmt::format("{}: unreadable listing", describe(prefix))};
      std::move(page->listing.objects.begin(), page->listing.objects.end(), std::back_inserter(out.objects));
      std::move(page->listing.prefixes.begin(), page->listing.prefixes.end(), std::back_inserter(out.prefixes));
      token = std::move(page->next_token);
      if (token.empty() || max_keys > 0) return out;
    }
  }

  // Creates the bucket (for tests and first set-up); an existing bucket of ours is fine.
  Result<void> create_bucket() {
    auto r = request({.method = "PUT", .key = {}, .bucket_only = true});
    if (!r && r.error().message.find("BucketAlreadyOwnedByYou") == std::string::npos) return r.error();
    return {};
  }

  // Counts of what the client did, for tests and statistics.
  std::uint64_t retries() const { return retries_.load(); }

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

  ObjectInfo info_from(const std::string& key, const detail::HttpReply& r) const {
    ObjectInfo o;
    o.key = key;
    auto len = r.header("content-length");
    o.size = len.empty() ? r.sunk : std::strtoull(len.c_str(), nullptr, 10);
    o.etag = detail::unquote(r.header("etag"));
    o.modified = detail::parse_http_date(r.header("last-modified"));
    return o;
  }

  Result<S3Credentials> credentials() {
    std::lock_guard lock(creds_mu_);
    if (refreshable_ && creds_.expires &&
        *creds_.expires - std::chrono::minutes(5) < std::chrono::system_clock::now()) {
      auto fresh = credentials_from_imds(pool_, settings_.imds_endpoint);
      if (!fresh) return fresh.error();
      creds_ = std::move(*fresh);
    }
    return creds_;
  }

  // Host and path for a key, by the addressing style.
  std::pair<std::string, std::string> locate(const Call& c) const {
    auto scheme_end = settings_.endpoint.find("://");
    std::string scheme = settings_.endpoint.substr(0, scheme_end);
    std::string host = settings_.endpoint.substr(scheme_end + 3);
    if ((scheme == "http" && host.ends_with(":80")) || (scheme == "https" && host.ends_with(":443")))
      host.erase(host.rfind(':'));
    std::string key_path = detail::uri_encode(c.key, true);
    if (settings_.path_style) return {host, fmt::format("/{}/{}", bucket_, key_path)};
    return {fmt::format("{}.{}", bucket_, host), fmt::format("/{}", key_path)};
  }

  // One request with signing and retries. Non-2xx statuses become errors that say what
  // the server said.
  Result<detail::HttpReply> request(Call c) {
    auto [host, path] = locate(c);
    if (c.bucket_only && settings_.path_style) path = fmt::format("/{}", bucket_);
    std::string query = detail::canonical_query(c.query);
    std::string url = fmt::format("{}://{}{}{}{}", settings_.endpoint.substr(0, settings_.endpoint.find("://")),
                                  host, path, query.empty() ? "" : "?", query);
    std::string payload_hash = c.body_fd >= 0 ? std::string(detail::k_unsigned_payload) : detail::sha256_hex(c.body);
    std::mt19937_64 rng(std::random_device{}());
    for (int attempt = 0;; ++attempt) {
      if (attempt > 0) {
        retries_.fetch_add(1);
        auto cap = std::min<std::int64_t>(settings_.backoff_cap.count(),
                                          settings_.backoff_base.count() << std::min(attempt - 1, 20));
        std::this_thread::sleep_for(std::chrono::milliseconds(
            std::uniform_int_distribution<std::int64_t>(cap / 2, std::max<std::int64_t>(cap, 1))(rng)));
      }
      auto creds = credentials();
      if (!creds) return creds.error();
      auto now = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
      std::string amz_date = fmt::format("{:%Y%m%dT%H%M%SZ}", now);
      detail::NameValues headers = c.headers;
      headers.emplace_back("Host", host);
      headers.emplace_back("x-amz-date", amz_date);
      headers.emplace_back("x-amz-content-sha256", payload_hash);
      if (!creds->session_token.empty()) headers.emplace_back("x-amz-security-token", creds->session_token);
      std::string auth = detail::sigv4_authorization(
          {c.method, path, query, headers, payload_hash},
          {creds->access_key, creds->secret_key, settings_.region, amz_date});
      headers.emplace_back("Authorization", auth);
      detail::HttpCall call{.method = c.method, .url = url, .headers = std::move(headers), .body = c.body,
                            .body_fd = c.body_fd, .body_offset = c.body_offset, .body_size = c.body_size,
                            .sink_fd = c.sink_fd, .connect_timeout = settings_.connect_timeout,
                            .stall_timeout = settings_.stall_timeout};
      if (c.sink_fd >= 0 && ::ftruncate(c.sink_fd, 0) != 0) return sys_error("truncate", "download");
      auto outcome = pool_.perform(call);
      bool last = attempt + 1 >= settings_.max_attempts;
      if (auto* t = std::get_if<detail::TransportError>(&outcome)) {
        if (detail::retryable(t->code) && !last) continue;
        return Error{t->code == CURLE_OPERATION_TIMEDOUT ? Errc::timed_out : Errc::io,
                     fmt::format("{} {}: {}{}", c.method, describe(c.key), t->text,
                                 attempt ? fmt::format(" (after {} tries)", attempt + 1) : "")};
      }
      auto& reply = std::get<detail::HttpReply>(outcome);
      if (reply.status >= 200 && reply.status < 300) return std::move(reply);
      auto [code, message] = detail::s3_error_fields(reply.body);
      bool transient = reply.status >= 500 || reply.status == 429 || code == "SlowDown" ||
                       code == "RequestTimeout" || code == "InternalError";
      if (transient && !last) continue;
      return status_error(c, reply.status, code, message, attempt + 1, creds->source);
    }
  }

  Error status_error(const Call& c, long status, const std::string& code, const std::string& message, int tries,
                     const std::string& source) const {
    std::string what = fmt::format("{} {}", c.method, describe(c.key));
    std::string said = code.empty() ? fmt::format("HTTP {}", status)
                                    : fmt::format("HTTP {} {}{}{}", status, code, message.empty() ? "" : ": ", message);
    std::string after = tries > 1 ? fmt::format(" (after {} tries)", tries) : "";
    if (code == "SignatureDoesNotMatch" || code == "InvalidAccessKeyId" || code == "AccessDenied" ||
        code == "ExpiredToken" || code == "InvalidToken" || status == 403)
      return Error{Errc::denied, fmt::format("{}: the server refused our credentials ({}, {}); check the "
                                             "access key and secret key",
                                             what, source, said)};
    if (status == 404) return Error{Errc::not_found, fmt::format("{}: not found ({})", what, said)};
    if (status == 412) return Error{Errc::precondition_failed, fmt::format("{}: precondition failed ({})", what, said)};
    return Error{Errc::io, fmt::format("{}: {}{}", what, said, after)};
  }

  Result<ObjectInfo> upload_parts(const std::string& key, int fd, std::uint64_t size, const PutCondition& cond) {
    auto started = request({.method = "POST", .key = key, .query = {{"uploads", ""}}});
    if (!started) return started.error();
    tinyxml2::XMLDocument doc;
    std::string upload_id;
    if (doc.Parse(started->body.data(), started->body.size()) == tinyxml2::XML_SUCCESS)
      if (auto* root = doc.FirstChildElement("InitiateMultipartUploadResult"))
        if (auto* id = root->FirstChildElement("UploadId"); id && id->GetText()) upload_id = id->GetText();
    if (upload_id.empty()) return Error{Errc::io, fmt::format("{}: no UploadId in the multipart answer", describe(key))};
    auto abort = [&](Error e) {
      (void)request({.method = "DELETE", .key = key, .query = {{"uploadId", upload_id}}});
      return e;
    };
    std::uint64_t part = std::max<std::uint64_t>(settings_.part_size, (size + 9999) / 10000);
    std::string complete = "<CompleteMultipartUpload>";
    for (std::uint64_t offset = 0, n = 1; offset < size; offset += part, ++n) {
      std::uint64_t len = std::min(part, size - offset);
      auto r = request({.method = "PUT", .key = key, .query = {{"partNumber", std::to_string(n)}, {"uploadId", upload_id}},
                        .body_fd = fd, .body_offset = offset, .body_size = len});
      if (!r) return abort(r.error());
      complete += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>\"{}\"</ETag></Part>", n,
                              detail::unquote(r->header("etag")));
    }
    complete += "</CompleteMultipartUpload>";
    Call c{.method = "POST", .key = key, .query = {{"uploadId", upload_id}}, .body = complete};
    add_condition(c, cond);
    auto done = request(std::move(c));
    if (!done) return abort(done.error());
    // A 200 can still carry an error in its body when the server failed while assembling.
    if (done->body.find("<Error>") != std::string::npos) {
      auto [code, message] = detail::s3_error_fields(done->body);
      return abort(Error{Errc::io, fmt::format("{}: completing the upload failed: {} {}", describe(key), code, message)});
    }
    return ObjectInfo{key, size, {}, {}};
  }

  std::string bucket_;
  S3Settings settings_;
  detail::CurlPool pool_;
  std::mutex creds_mu_;
  S3Credentials creds_;
  bool refreshable_ = false;
  std::atomic<std::uint64_t> retries_{0};
};

}  // namespace neffcache
