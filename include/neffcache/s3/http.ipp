// Definitions of s3/http.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/http.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include <fmt/format.h>

namespace neffcache {
namespace detail {

NEFFCACHE_DECL void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

NEFFCACHE_DECL std::string trim(std::string_view s) {
  auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  auto last = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(first, last - first + 1));
}

NEFFCACHE_DECL std::chrono::system_clock::time_point from_utc(std::tm tm) {
  if (tm.tm_year < 70 || tm.tm_year > 300) return {};
  return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

NEFFCACHE_DECL std::chrono::system_clock::time_point parse_iso8601(std::string_view s) {
  std::tm tm{};
  if (std::sscanf(std::string(s).c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6)
    return {};
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return from_utc(tm);
}

NEFFCACHE_DECL std::chrono::system_clock::time_point parse_http_date(const std::string& s) {
  std::tm tm{};
  const char* end = ::strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (!end) return {};
  return from_utc(tm);
}

NEFFCACHE_DECL bool retryable(CURLcode c) {
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

NEFFCACHE_DECL CurlPool::~CurlPool() {
  for (CURL* h : idle_) curl_easy_cleanup(h);
}

NEFFCACHE_DECL std::variant<HttpReply, TransportError> CurlPool::perform(const HttpCall& call) {
  CURL* h = take();
  auto result = run(h, call);
  give_back(h);
  return result;
}

NEFFCACHE_DECL std::size_t CurlPool::on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  if (line.substr(0, 5) == "HTTP/") t->reply->headers.clear();  // a new response (after 100-continue)
  auto colon = line.find(':');
  if (colon != std::string_view::npos)
    t->reply->headers.emplace_back(lower(std::string(line.substr(0, colon))), trim(line.substr(colon + 1)));
  return size * n;
}

NEFFCACHE_DECL std::size_t CurlPool::on_body(char* data, std::size_t size, std::size_t n, void* user) {
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

NEFFCACHE_DECL std::size_t CurlPool::on_read(char* buf, std::size_t size, std::size_t n, void* user) {
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

NEFFCACHE_DECL int CurlPool::on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0) return CURL_SEEKFUNC_CANTSEEK;
  t->sent = static_cast<std::uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

NEFFCACHE_DECL curl_socket_t CurlPool::on_open_socket(void*, curlsocktype, curl_sockaddr* address) {
  return ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

NEFFCACHE_DECL std::variant<HttpReply, TransportError> CurlPool::run(CURL* h, const HttpCall& call) {
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
  curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, &on_open_socket);
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

NEFFCACHE_DECL CURL* CurlPool::take() {
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

}  // namespace detail
}  // namespace neffcache
