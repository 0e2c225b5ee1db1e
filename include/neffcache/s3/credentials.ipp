// Definitions of s3/credentials.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/credentials.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::optional<std::vector<std::pair<std::string, std::string>>> ini_section(const std::string& text,
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

NEFFCACHE_DECL std::string home_file(const EnvLookup& env, const char* var, std::string_view under_home) {
  if (auto v = env(var); v && !v->empty()) return *v;
  auto home = env("HOME");
  return fmt::format("{}/{}", home ? *home : "", under_home);
}

}  // namespace detail

NEFFCACHE_DECL Result<std::optional<S3Credentials>> credentials_from_env(const EnvLookup& env) {
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

NEFFCACHE_DECL Result<std::optional<S3Credentials>> credentials_from_profile(const EnvLookup& env) {
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

NEFFCACHE_DECL std::optional<std::string> region_from_profile(const EnvLookup& env) {
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

NEFFCACHE_DECL Result<S3Credentials> credentials_from_imds(detail::CurlPool& pool, const std::string& endpoint) {
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

NEFFCACHE_DECL Result<S3Settings> s3_settings_from_env(const std::string& bucket, const EnvLookup& env) {
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
}  // namespace neffcache
