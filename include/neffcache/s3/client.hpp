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
//              AWS_EC2_METADATA_DISABLED=true.
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

namespace neffcache {

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty unless temporary credentials
  std::optional<std::chrono::system_clock::time_point> expires;
  std::string source;  // "environment", "profile default", "instance metadata": for messages
};

struct S3Settings {
  std::string endpoint = {};  // "scheme://host[:port]", no path
  std::string region = "us-east-1";
  bool path_style = true;
  int max_attempts = 6;  // tries per request, the first included
  std::chrono::milliseconds backoff_base{100};   // the n-th retry waits up to base * 2^n,
  std::chrono::milliseconds backoff_cap{10000};  // never more than the cap (full jitter)
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::seconds stall_timeout{30};  // a transfer moving no byte this long is cut
  std::uint64_t multipart_threshold = 64ull << 20;  // files larger go up in parts
  std::uint64_t part_size = 16ull << 20;
  std::string imds_endpoint = "http://169.254.169.254";
  bool imds_enabled = true;
};

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

inline void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

inline std::string trim(std::string_view s) {
  auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  auto last = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(first, last - first + 1));
}

inline std::string unquote(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

// A UTC calendar time (tm_year counts from 1900) as a time point; zero outside 1970 to
// 2200, which the clock's nanoseconds could not all hold (year 2497 overflowed them: the
// fuzzer found it in a Date header).
inline std::chrono::system_clock::time_point from_utc(std::tm tm) {
  if (tm.tm_year < 70 || tm.tm_year > 300) return {};
  return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

// "2026-11-22T20:00:00.000Z" (ISO 8601, S3 listings) to a time point; zero if unreadable.
inline std::chrono::system_clock::time_point parse_iso8601(std::string_view s) {
  std::tm tm{};
  if (std::sscanf(std::string(s).c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6)
    return {};
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return from_utc(tm);
}

// An HTTP date, "Sun, 22 Nov 2026 20:15:12 GMT" (RFC 7231), to a time point; zero if
// unreadable.
inline std::chrono::system_clock::time_point parse_http_date(const std::string& s) {
  std::tm tm{};
  const char* end = ::strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (!end) return {};
  return from_utc(tm);
}

// One HTTP exchange as curl sees it, signed or not.
struct HttpCall {
  std::string method = "GET";
  std::string url = {};
  NameValues headers = {};
  std::string_view body = {};  // an in-memory body, or
  int body_fd = -1;         // a file range: body_size bytes from body_offset
  std::uint64_t body_offset = 0;
  std::uint64_t body_size = 0;
  int sink_fd = -1;         // a 2xx body goes here (pwrite from 0) instead of into `body`
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::seconds stall_timeout{30};
  std::chrono::milliseconds total_timeout{0};  // 0: none (large transfers)
};

struct HttpReply {
  long status = 0;
  NameValues headers;  // names lower-cased
  std::string body;    // the body, unless a 2xx went to sink_fd
  std::uint64_t sunk = 0;

  std::string header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return {};
  }
};

// A transport failure (no HTTP status): curl's code and text.
struct TransportError {
  CURLcode code;
  std::string text;
};

inline bool retryable(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

// Reuses curl handles (and with them their connections) across calls and threads.
class CurlPool {
 public:
  CurlPool() { curl_init_once(); }
  ~CurlPool() {
    for (CURL* h : idle_) curl_easy_cleanup(h);
  }
  CurlPool(const CurlPool&) = delete;
  CurlPool& operator=(const CurlPool&) = delete;

  // Runs one exchange. A transport failure returns the TransportError; any HTTP
  // status is a reply.
  std::variant<HttpReply, TransportError> perform(const HttpCall& call) {
    CURL* h = take();
    auto result = run(h, call);
    give_back(h);
    return result;
  }

 private:
  struct Transfer {
    const HttpCall* call;
    CURL* handle;
    HttpReply* reply;
    std::uint64_t sent = 0;
    int write_errno = 0;
  };

  static std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    std::string_view line(data, size * n);
    if (line.substr(0, 5) == "HTTP/") t->reply->headers.clear();  // a new response (after 100-continue)
    auto colon = line.find(':');
    if (colon != std::string_view::npos)
      t->reply->headers.emplace_back(lower(std::string(line.substr(0, colon))), trim(line.substr(colon + 1)));
    return size * n;
  }

  static std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    std::size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &status);
    if (t->call->sink_fd >= 0 && status >= 200 && status < 300) {
      for (std::size_t done = 0; done < len;) {
        ssize_t w = sys::pwrite(t->call->sink_fd, data + done, len - done,
                                static_cast<off_t>(t->reply->sunk + done));
        if (w < 0) {
          t->write_errno = errno;
          return 0;  // curl stops with CURLE_WRITE_ERROR
        }
        done += static_cast<std::size_t>(w);
      }
      t->reply->sunk += len;
      return len;
    }
    if (t->reply->body.size() + len > (4u << 20)) return 0;  // an error body this large is not S3
    t->reply->body.append(data, len);
    return len;
  }

  static std::size_t on_read(char* buf, std::size_t size, std::size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const HttpCall& c = *t->call;
    std::uint64_t total = c.body_fd >= 0 ? c.body_size : c.body.size();
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(size * n, total - t->sent));
    if (want == 0) return 0;
    if (c.body_fd >= 0) {
      ssize_t r = sys::pread(c.body_fd, buf, want, static_cast<off_t>(c.body_offset + t->sent));
      if (r <= 0) return CURL_READFUNC_ABORT;  // the file shrank or failed: never send a short body
      want = static_cast<std::size_t>(r);
    } else {
      std::memcpy(buf, c.body.data() + t->sent, want);
    }
    t->sent += want;
    return want;
  }

  static int on_seek(void* user, curl_off_t offset, int origin) {
    auto* t = static_cast<Transfer*>(user);
    if (origin != SEEK_SET || offset < 0) return CURL_SEEKFUNC_CANTSEEK;
    t->sent = static_cast<std::uint64_t>(offset);
    return CURL_SEEKFUNC_OK;
  }

  std::variant<HttpReply, TransportError> run(CURL* h, const HttpCall& call) {
    curl_easy_reset(h);
    HttpReply reply;
    Transfer t{&call, h, &reply};
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_slist* headers = nullptr;
    for (const auto& [k, v] : call.headers) headers = curl_slist_append(headers, fmt::format("{}: {}", k, v).c_str());
    // curl would otherwise wait a second for "100 Continue" before every upload body.
    headers = curl_slist_append(headers, "Expect:");
    std::uint64_t body_size = call.body_fd >= 0 ? call.body_size : call.body.size();
    bool has_body = call.method == "PUT" || call.method == "POST";
    curl_easy_setopt(h, CURLOPT_URL, call.url.c_str());
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(call.connect_timeout.count()));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(call.stall_timeout.count()));
    if (call.total_timeout.count() > 0)
      curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(call.total_timeout.count()));
    if (call.method == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (has_body) {
      curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, call.method.c_str());
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body_size));
      curl_easy_setopt(h, CURLOPT_READFUNCTION, &on_read);
      curl_easy_setopt(h, CURLOPT_READDATA, &t);
      curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &on_seek);
      curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    } else if (call.method != "GET") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, call.method.c_str());
    }
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK) {
      std::string text = errbuf[0] ? errbuf : curl_easy_strerror(rc);
      if (t.write_errno) text = fmt::format("writing the download: {}", std::strerror(t.write_errno));
      return TransportError{rc, text};
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &reply.status);
    return reply;
  }

  CURL* take() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        return h;
      }
    }
    CURL* h = curl_easy_init();
    if (!h) throw std::bad_alloc();
    return h;
  }

  void give_back(CURL* h) {
    std::lock_guard lock(mu_);
    idle_.push_back(h);
  }

  std::mutex mu_;
  std::vector<CURL*> idle_;
};

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

// Reads an INI file section ("[name]") as key = value pairs. Comments (# ;) and
// blank lines are skipped.
inline std::optional<std::vector<std::pair<std::string, std::string>>> ini_section(const std::string& text,
                                                                                   std::string_view section) {
  std::optional<std::vector<std::pair<std::string, std::string>>> out;
  bool inside = false;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    auto end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = trim(std::string_view(text).substr(pos, end - pos));
    pos = end + 1;
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      inside = trim(std::string_view(line).substr(1, line.size() - 2)) == section;
      if (inside && !out) out.emplace();
      continue;
    }
    auto eq = line.find('=');
    if (inside && eq != std::string::npos) out->emplace_back(trim(line.substr(0, eq)), trim(line.substr(eq + 1)));
  }
  return out;
}

inline std::string home_file(const EnvLookup& env, const char* var, std::string_view under_home) {
  if (auto v = env(var); v && !v->empty()) return *v;
  auto home = env("HOME");
  return fmt::format("{}/{}", home ? *home : "", under_home);
}

}  // namespace detail

// Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN);
// nullopt when unset, an error when only one of the pair is set.
inline Result<std::optional<S3Credentials>> credentials_from_env(const EnvLookup& env) {
  auto id = env("AWS_ACCESS_KEY_ID");
  auto secret = env("AWS_SECRET_ACCESS_KEY");
  bool has_id = id && !id->empty(), has_secret = secret && !secret->empty();
  if (!has_id && !has_secret) return std::optional<S3Credentials>{};
  if (has_id != has_secret)
    return Error{Errc::invalid_argument,
                 fmt::format("{} is set but {} is not", has_id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                             has_id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID")};
  auto token = env("AWS_SESSION_TOKEN");
  return std::optional<S3Credentials>{S3Credentials{*id, *secret, token ? *token : "", {}, "environment"}};
}

// Credentials of the AWS_PROFILE (default "default") profile in the shared credentials
// file. nullopt when the file or the default profile does not exist; an error when a
// named profile is missing or incomplete.
inline Result<std::optional<S3Credentials>> credentials_from_profile(const EnvLookup& env) {
  auto named = env("AWS_PROFILE");
  std::string profile = named && !named->empty() ? *named : "default";
  std::string path = detail::home_file(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  auto text = detail::read_file(path);
  if (!text) {
    if (text.error().code == Errc::not_found && profile == "default") return std::optional<S3Credentials>{};
    return Error{text.error().code, fmt::format("AWS profile '{}': {}", profile, text.error().message)};
  }
  auto section = detail::ini_section(*text, profile);
  if (!section) {
    if (profile == "default") return std::optional<S3Credentials>{};
    return Error{Errc::not_found, fmt::format("AWS profile '{}' is not in {}", profile, path)};
  }
  S3Credentials c;
  c.source = fmt::format("profile {}", profile);
  for (const auto& [k, v] : *section) {
    if (k == "aws_access_key_id") c.access_key = v;
    else if (k == "aws_secret_access_key") c.secret_key = v;
    else if (k == "aws_session_token") c.session_token = v;
  }
  if (c.access_key.empty() || c.secret_key.empty())
    return Error{Errc::invalid_argument,
                 fmt::format("AWS profile '{}' in {} lacks aws_access_key_id or aws_secret_access_key", profile, path)};
  return std::optional<S3Credentials>{c};
}

// The region the profile names in the AWS config file, if any.
inline std::optional<std::string> region_from_profile(const EnvLookup& env) {
  auto named = env("AWS_PROFILE");
  std::string profile = named && !named->empty() ? *named : "default";
  auto text = detail::read_file(detail::home_file(env, "AWS_CONFIG_FILE", ".aws/config"));
  if (!text) return std::nullopt;
  auto section = detail::ini_section(*text, profile == "default" ? "default" : fmt::format("profile {}", profile));
  if (!section) return std::nullopt;
  for (const auto& [k, v] : *section)
    if (k == "region" && !v.empty()) return v;
  return std::nullopt;
}

// Temporary credentials of the instance's role from the EC2 instance metadata service,
// IMDSv2: a session token by PUT, then the role name, then its credentials.
inline Result<S3Credentials> credentials_from_imds(detail::CurlPool& pool, const std::string& endpoint) {
  auto call = [&](std::string method, std::string path, detail::NameValues headers) -> Result<std::string> {
    detail::HttpCall c;
    c.method = std::move(method);
    c.url = endpoint + path;
    c.headers = std::move(headers);
    c.connect_timeout = std::chrono::milliseconds(1000);
    c.total_timeout = std::chrono::milliseconds(3000);
    auto r = pool.perform(c);
    if (auto* t = std::get_if<detail::TransportError>(&r))
      return Error{Errc::io, fmt::format("instance metadata at {}: {}", endpoint, t->text)};
    auto& reply = std::get<detail::HttpReply>(r);
    if (reply.status != 200)
      return Error{reply.status == 404 ? Errc::not_found : Errc::io,
                   fmt::format("instance metadata {}{}: HTTP {}", endpoint, path, reply.status)};
    return std::move(reply.body);
  };
  auto token = call("PUT", "/latest/api/token", {{"X-aws-ec2-metadata-token-ttl-seconds", "21600"}});
  if (!token) return token.error();
  detail::NameValues auth{{"X-aws-ec2-metadata-token", *token}};
  auto roles = call("GET", "/latest/meta-data/iam/security-credentials/", auth);
  if (!roles) return roles.error();
  std::string role = detail::trim(std::string_view(*roles).substr(0, roles->find('\n')));
  if (role.empty()) return Error{Errc::not_found, fmt::format("instance metadata at {}: no IAM role", endpoint)};
  auto doc = call("GET", fmt::format("/latest/meta-data/iam/security-credentials/{}", role), auth);
  if (!doc) return doc.error();
  auto j = nlohmann::json::parse(*doc, nullptr, false);
  if (!j.is_object() || !j.contains("AccessKeyId") || !j.contains("SecretAccessKey") ||
      !j["AccessKeyId"].is_string() || !j["SecretAccessKey"].is_string())
    return Error{Errc::io, fmt::format("instance metadata at {}: role '{}' gave no credentials", endpoint, role)};
  S3Credentials c;
  c.access_key = j["AccessKeyId"];
  c.secret_key = j["SecretAccessKey"];
  if (j.contains("Token") && j["Token"].is_string()) c.session_token = j["Token"];
  if (j.contains("Expiration") && j["Expiration"].is_string()) {
    auto t = detail::parse_iso8601(j["Expiration"].get<std::string>());
    if (t.time_since_epoch().count() != 0) c.expires = t;
  }
  c.source = fmt::format("instance metadata (role {})", role);
  return c;
}

// Reads the settings from the environment (see the top of this file). Errors: a
// malformed endpoint or addressing value.
inline Result<S3Settings> s3_settings_from_env(const std::string& bucket, const EnvLookup& env = process_env) {
  S3Settings s;
  auto get = [&](const char* name) -> std::optional<std::string> {
    auto v = env(name);
    if (v && !v->empty()) return v;
    return std::nullopt;
  };
  if (auto r = get("AWS_REGION")) s.region = *r;
  else if (auto d = get("AWS_DEFAULT_REGION")) s.region = *d;
  else if (auto p = region_from_profile(env)) s.region = *p;
  auto endpoint = get("AWS_ENDPOINT_URL_S3");
  if (!endpoint) endpoint = get("AWS_ENDPOINT_URL");
  if (endpoint) {
    std::string e = *endpoint;
    while (!e.empty() && e.back() == '/') e.pop_back();
    auto scheme = e.find("://");
    if ((e.substr(0, scheme) != "http" && e.substr(0, scheme) != "https") || scheme == std::string::npos ||
        e.size() == scheme + 3 || e.find('/', scheme + 3) != std::string::npos)
      return Error{Errc::invalid_argument,
                   fmt::format("S3 endpoint '{}' must be http(s)://host[:port] with no path", *endpoint)};
    s.endpoint = e;
    s.path_style = true;
  } else {
    s.endpoint = fmt::format("https://s3.{}.amazonaws.com", s.region);
    s.path_style = bucket.find('.') != std::string::npos;  // a dotted name breaks the TLS wildcard
  }
  if (auto a = get("NEFFCACHE_S3_ADDRESSING")) {
    if (*a == "path") s.path_style = true;
    else if (*a == "virtual") s.path_style = false;
    else
      return Error{Errc::invalid_argument,
                   fmt::format("NEFFCACHE_S3_ADDRESSING is '{}' (use path or virtual)", *a)};
  }
  if (auto m = get("AWS_EC2_METADATA_SERVICE_ENDPOINT")) {
    s.imds_endpoint = *m;
    while (!s.imds_endpoint.empty() && s.imds_endpoint.back() == '/') s.imds_endpoint.pop_back();
  }
  if (auto d = get("AWS_EC2_METADATA_DISABLED")) s.imds_enabled = detail::lower(*d) != "true";
  return s;
}

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
    auto size = static_cast<std::uint64_t>(st.st_size);
    if (size > settings_.multipart_threshold) return upload_parts(key, fd->get(), size, cond);
    Call c{.method = "PUT", .key = key, .body_fd = fd->get(), .body_size = size};
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
