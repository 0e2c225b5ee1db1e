// Definitions of s3/client.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/client.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <random>
#include <thread>
#include <variant>

#include <curl/curl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <tinyxml2.h>

#include <neffcache/core/detail/proc.hpp>

namespace neffcache {

NEFFCACHE_DECL std::string s3_key(const std::string& prefix, std::string_view rel) {
  return prefix.empty() ? std::string(rel) : fmt::format("{}/{}", prefix, rel);
}

namespace detail {

NEFFCACHE_DECL std::pair<std::string, std::string> s3_error_fields(const std::string& xml) {
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

NEFFCACHE_DECL std::optional<ListingPage> parse_listing(std::string_view xml) {
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

NEFFCACHE_DECL Result<std::unique_ptr<S3Client>> S3Client::open(const CacheUrl& url, const EnvLookup& env) {
  auto r = open_unnamed(url, env);
  if (!r) return Error{r.error().code, fmt::format("{}: {}", url.text, r.error().message)};
  return r;
}

NEFFCACHE_DECL std::string S3Client::describe(std::string_view key) const {
  return fmt::format("s3://{}/{}", bucket_, key);
}

NEFFCACHE_DECL Result<std::unique_ptr<S3Client>> S3Client::open_unnamed(const CacheUrl& url, const EnvLookup& env) {
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

NEFFCACHE_DECL Result<ObjectBytes> S3Client::get_with_info(const std::string& key) {
  auto r = request({.method = "GET", .key = key});
  if (!r) return r.error();
  ObjectBytes out{info_from(key, *r), std::move(r->body), detail::parse_http_date(r->header("date"))};
  return out;
}

NEFFCACHE_DECL Result<ObjectInfo> S3Client::download(const std::string& key, const std::string& path,
                                                    const std::optional<detail::FileOwner>& owner, FileSync sync) {
  std::string tmp = detail::temp_name_beside(path);
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
  if (r->sunk != info.size)
    return fail(Error{Errc::io, fmt::format("{}: got {} of {} bytes", describe(key), r->sunk, info.size)});
  if (sync == FileSync::now && sys::fsync(fd.get()) != 0) return fail(sys_error("fsync", tmp));
  fd.reset();
  if (sys::rename(tmp.c_str(), path.c_str()) != 0) return fail(sys_error("rename", path));
  return info;
}

NEFFCACHE_DECL Result<ObjectInfo> S3Client::put(const std::string& key, std::string_view bytes,
                                               const PutCondition& cond) {
  Call c{.method = "PUT", .key = key, .body = bytes};
  add_condition(c, cond);
  auto r = request(std::move(c));
  if (!r) return r.error();
  return ObjectInfo{key, bytes.size(), detail::unquote(r->header("etag")), {}};
}

NEFFCACHE_DECL Result<ObjectInfo> S3Client::upload(const std::string& key, const std::string& path,
                                                  const PutCondition& cond) {
  struct stat st {};
  auto fd = detail::open_regular(path, &st);
  if (!fd) return fd.error();
  return upload_fd(key, fd->get(), static_cast<std::uint64_t>(st.st_size), cond);
}

NEFFCACHE_DECL Result<ObjectInfo> S3Client::upload_fd(const std::string& key, int fd, std::uint64_t size,
                                                     const PutCondition& cond) {
  if (size > settings_.multipart_threshold) return upload_parts(key, fd, size, cond);
  Call c{.method = "PUT", .key = key, .body_fd = fd, .body_size = size};
  add_condition(c, cond);
  auto r = request(std::move(c));
  if (!r) return r.error();
  return ObjectInfo{key, size, detail::unquote(r->header("etag")), {}};
}

NEFFCACHE_DECL Result<std::string> S3Client::copy(const std::string& from, const std::string& to,
                                                 std::string_view if_match) {
  Call c{.method = "PUT", .key = to};
  c.headers.emplace_back("x-amz-copy-source", fmt::format("/{}/{}", bucket_, detail::uri_encode(from, true)));
  if (!if_match.empty()) c.headers.emplace_back("x-amz-copy-source-if-match", detail::unquote(if_match));
  auto r = request(std::move(c));
  if (!r) return r.error();
  // As for a multipart upload, a 200 can carry an error in its body.
  tinyxml2::XMLDocument doc;
  if (doc.Parse(r->body.data(), r->body.size()) == tinyxml2::XML_SUCCESS)
    if (auto* result = doc.FirstChildElement("CopyObjectResult"))
      if (auto* etag = result->FirstChildElement("ETag"); etag && etag->GetText()) {
        std::string got = detail::unquote(etag->GetText());
        const std::string want = detail::unquote(if_match);
        auto one_part = [](const std::string& e) { return e.find('-') == std::string::npos; };
        // Under SSE-KMS or SSE-C an ETag is no MD5: equal bytes have other ETags (AWS, which
        // honours the condition, encrypts so; radosgw 16, which does not, answers these
        // headers only for such objects too).
        const std::string sse = r->header("x-amz-server-side-encryption");
        const bool md5_etags = !sse.starts_with("aws:kms") &&
                               r->header("x-amz-server-side-encryption-customer-algorithm").empty();
        if (want.empty() || got == want || !one_part(got) || !one_part(want) || !md5_etags) return got;
        (void)remove(to);
        return Error{Errc::precondition_failed,
                     fmt::format("copy {}: it is no longer the version {} (now {})", describe(from), want, got)};
      }
  auto [code, message] = detail::s3_error_fields(r->body);
  return Error{Errc::io, fmt::format("copy {} to {}: {}", describe(from), describe(to),
                                     code.empty() ? std::string("no CopyObjectResult in the answer")
                                                  : fmt::format("{} {}", code, message))};
}

NEFFCACHE_DECL Result<Listing> S3Client::list(const std::string& prefix, std::string_view delimiter,
                                             std::size_t max_keys) {
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

NEFFCACHE_DECL ObjectInfo S3Client::info_from(const std::string& key, const detail::HttpReply& r) const {
  ObjectInfo o;
  o.key = key;
  auto len = r.header("content-length");
  o.size = len.empty() ? r.sunk : std::strtoull(len.c_str(), nullptr, 10);
  o.etag = detail::unquote(r.header("etag"));
  o.modified = detail::parse_http_date(r.header("last-modified"));
  return o;
}

NEFFCACHE_DECL std::unique_ptr<S3Client> S3Client::quick() {
  S3Settings s = settings_;
  s.max_attempts = 2;
  s.backoff_base = std::chrono::milliseconds(50);
  s.connect_timeout = std::chrono::milliseconds(2000);
  s.stall_timeout = std::chrono::seconds(5);
  s.request_timeout = std::chrono::milliseconds(5000);
  std::unique_ptr<S3Client> q(new S3Client(bucket_, std::move(s)));
  std::lock_guard lock(creds_mu_);
  q->creds_ = creds_;
  q->refreshable_ = refreshable_;
  return q;
}

NEFFCACHE_DECL Result<S3Credentials> S3Client::credentials() {
  std::lock_guard lock(creds_mu_);
  if (refreshable_ && creds_.expires &&
      *creds_.expires - std::chrono::minutes(5) < std::chrono::system_clock::now()) {
    auto fresh = credentials_from_imds(pool_, settings_.imds_endpoint);
    if (!fresh) return fresh.error();
    creds_ = std::move(*fresh);
  }
  return creds_;
}

NEFFCACHE_DECL std::pair<std::string, std::string> S3Client::locate(const Call& c) const {
  auto scheme_end = settings_.endpoint.find("://");
  std::string scheme = settings_.endpoint.substr(0, scheme_end);
  std::string host = settings_.endpoint.substr(scheme_end + 3);
  if ((scheme == "http" && host.ends_with(":80")) || (scheme == "https" && host.ends_with(":443")))
    host.erase(host.rfind(':'));
  std::string key_path = detail::uri_encode(c.key, true);
  if (settings_.path_style) return {host, fmt::format("/{}/{}", bucket_, key_path)};
  return {fmt::format("{}.{}", bucket_, host), fmt::format("/{}", key_path)};
}

NEFFCACHE_DECL Result<detail::HttpReply> S3Client::request(Call c) {
  auto [host, path] = locate(c);
  if (c.bucket_only && settings_.path_style) path = fmt::format("/{}", bucket_);
  std::string query = detail::canonical_query(c.query);
  std::string url = fmt::format("{}://{}{}{}{}", settings_.endpoint.substr(0, settings_.endpoint.find("://")),
                                host, path, query.empty() ? "" : "?", query);
  std::string payload_hash = c.body_fd >= 0 ? std::string(detail::k_unsigned_payload) : detail::sha256_hex(c.body);
  std::mt19937_64 rng(detail::random_u64());
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
                          .stall_timeout = settings_.stall_timeout, .total_timeout = settings_.request_timeout};
    if (c.sink_fd >= 0 && ::ftruncate(c.sink_fd, 0) != 0) return sys_error("truncate", "download");
    auto outcome = pool_.perform(call);
    requests_.fetch_add(1);
    bool last = attempt + 1 >= settings_.max_attempts;
    if (auto* t = std::get_if<detail::TransportError>(&outcome)) {
      request_errors_.fetch_add(1);
      if (detail::retryable(t->code) && !last) continue;
      return Error{t->code == CURLE_OPERATION_TIMEDOUT ? Errc::timed_out : Errc::io,
                   fmt::format("{} {}: {}{}", c.method, describe(c.key), t->text,
                               attempt ? fmt::format(" (after {} tries)", attempt + 1) : "")};
    }
    auto& reply = std::get<detail::HttpReply>(outcome);
    if (reply.status >= 200 && reply.status < 300) return std::move(reply);
    if (reply.status != 404 && reply.status != 412) request_errors_.fetch_add(1);
    auto [code, message] = detail::s3_error_fields(reply.body);
    bool transient = reply.status >= 500 || reply.status == 429 || code == "SlowDown" ||
                     code == "RequestTimeout" || code == "InternalError";
    if (transient && !last) continue;
    return status_error(c, reply.status, code, message, attempt + 1, creds->source);
  }
}

NEFFCACHE_DECL Error S3Client::status_error(const Call& c, long status, const std::string& code,
                                           const std::string& message, int tries, const std::string& source) const {
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

NEFFCACHE_DECL Result<ObjectInfo> S3Client::upload_parts(const std::string& key, int fd, std::uint64_t size,
                                                        const PutCondition& cond) {
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
    auto r = request({.method = "PUT", .key = key,
                      .query = {{"partNumber", std::to_string(n)}, {"uploadId", upload_id}},
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
  // The object's ETag is made as the upload completes: from that answer, else (radosgw 16
  // answers an empty one) asked for.
  ObjectInfo made{key, size, {}, {}};
  if (doc.Parse(done->body.data(), done->body.size()) == tinyxml2::XML_SUCCESS)
    if (auto* result = doc.FirstChildElement("CompleteMultipartUploadResult"))
      if (auto* etag = result->FirstChildElement("ETag"); etag && etag->GetText()) made.etag = detail::unquote(etag->GetText());
  if (made.etag.empty())
    if (auto there = head(key)) made.etag = there->etag;
  return made;
}

}  // namespace neffcache
