// Where the S3 client's settings and credentials come from, as the AWS tools read them:
// the environment, the shared credentials and config files (a profile), and the EC2
// instance metadata service (IMDSv2). See s3/client.hpp for the variables read.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/s3/http.hpp>

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
  std::chrono::milliseconds request_timeout{0};  // one try's whole time (0: none, as large transfers need)
  std::uint64_t multipart_threshold = 64ull << 20;  // files larger go up in parts
  std::uint64_t part_size = 16ull << 20;
  std::string imds_endpoint = "http://169.254.169.254";
  bool imds_enabled = true;
};
namespace detail {

// Reads an INI file section ("[name]") as key = value pairs. Comments (# ;) and
// blank lines are skipped.
NEFFCACHE_DECL std::optional<std::vector<std::pair<std::string, std::string>>> ini_section(const std::string& text,
                                                                                           std::string_view section);
// The file a variable names, else the path under $HOME.
NEFFCACHE_DECL std::string home_file(const EnvLookup& env, const char* var, std::string_view under_home);

}  // namespace detail

// Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN);
// nullopt when unset, an error when only one of the pair is set.
NEFFCACHE_DECL Result<std::optional<S3Credentials>> credentials_from_env(const EnvLookup& env);

// Credentials of the AWS_PROFILE (default "default") profile in the shared credentials
// file. nullopt when the file or the default profile does not exist; an error when a
// named profile is missing or incomplete.
NEFFCACHE_DECL Result<std::optional<S3Credentials>> credentials_from_profile(const EnvLookup& env);

// The region the profile names in the AWS config file, if any.
NEFFCACHE_DECL std::optional<std::string> region_from_profile(const EnvLookup& env);

// Temporary credentials of the instance's role from the EC2 instance metadata service,
// IMDSv2: a session token by PUT, then the role name, then its credentials.
NEFFCACHE_DECL Result<S3Credentials> credentials_from_imds(detail::CurlPool& pool, const std::string& endpoint);

// Reads the settings from the environment (see the top of this file). Errors: a
// malformed endpoint or addressing value.
NEFFCACHE_DECL Result<S3Settings> s3_settings_from_env(const std::string& bucket, const EnvLookup& env = process_env);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/credentials.ipp>
#endif
