// HTTP for the S3 client, over libcurl: a pool of curl handles (and their connections)
// shared by threads, one exchange (HttpCall -> HttpReply or TransportError), which
// transport failures are worth a retry, and the date formats S3 answers with. Knows
// nothing of S3's requests or signing (s3/client.hpp, s3/detail/sigv4.hpp).
#pragma once

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <mutex>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <curl/curl.h>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/s3/detail/sigv4.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL void curl_init_once();

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

NEFFCACHE_DECL std::string trim(std::string_view s);

inline std::string unquote(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

// A UTC calendar time (tm_year counts from 1900) as a time point; zero outside 1970 to
// 2200, which the clock's nanoseconds could not all hold (year 2497 overflowed them: the
// fuzzer found it in a Date header).
NEFFCACHE_DECL std::chrono::system_clock::time_point from_utc(std::tm tm);

// "2026-11-22T20:00:00.000Z" (ISO 8601, S3 listings) to a time point; zero if unreadable.
NEFFCACHE_DECL std::chrono::system_clock::time_point parse_iso8601(std::string_view s);

// An HTTP date, "Sun, 22 Nov 2026 20:15:12 GMT" (RFC 7231), to a time point; zero if
// unreadable.
NEFFCACHE_DECL std::chrono::system_clock::time_point parse_http_date(const std::string& s);

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

NEFFCACHE_DECL bool retryable(CURLcode c);

// Reuses curl handles (and with them their connections) across calls and threads.
class CurlPool {
 public:
  CurlPool() { curl_init_once(); }
  ~CurlPool();
  CurlPool(const CurlPool&) = delete;
  CurlPool& operator=(const CurlPool&) = delete;

  // Runs one exchange. A transport failure returns the TransportError; any HTTP
  // status is a reply.
  std::variant<HttpReply, TransportError> perform(const HttpCall& call);

 private:
  struct Transfer {
    const HttpCall* call;
    CURL* handle;
    HttpReply* reply;
    std::uint64_t sent = 0;
    int write_errno = 0;
  };

  static std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user);
  static std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user);
  static std::size_t on_read(char* buf, std::size_t size, std::size_t n, void* user);
  static int on_seek(void* user, curl_off_t offset, int origin);
  // Makes each socket curl connects with, close-on-exec: curl's own are inherited by a
  // program this process runs (the compiler shim runs the real compiler), which would hold
  // the connections to the bucket open for as long as it runs.
  static curl_socket_t on_open_socket(void* user, curlsocktype purpose, curl_sockaddr* address);

  std::variant<HttpReply, TransportError> run(CURL* h, const HttpCall& call);

  CURL* take();

  void give_back(CURL* h) {
    std::lock_guard lock(mu_);
    idle_.push_back(h);
  }

  std::mutex mu_;
  std::vector<CURL*> idle_;
};

}  // namespace detail

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/http.ipp>
#endif
