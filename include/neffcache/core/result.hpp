// Recoverable errors as values: every library function that can fail on bad input
// or on the file system returns Result<T>. Callers map Error::code to errno (the
// daemon) or to an exit code (the tools); the message is one line for a human.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <neffcache/core/decl.hpp>

namespace neffcache {

// Stable error identities: the name is greppable and the set only grows.
enum class Errc {
  invalid_argument,  // a caller-supplied value is malformed (flag, URL, template...)
  bad_hlo,           // bytes that are not a readable HLO module
  bad_flags_file,    // compile_flags.json is not a JSON list of strings
  io,                // a system call failed; Error::sys_errno says which errno
  not_found,         // a file or entry that must exist does not
  busy,              // held by someone else who is alive (a lock, an entry being compiled)
  timed_out,         // a deadline passed before the operation could finish
  denied,            // a store refused our credentials, or we have none
  precondition_failed,  // a conditional write lost: the object exists or changed
  exists,            // a name that must be new is taken (a publish onto an entry that exists)
};

NEFFCACHE_DECL const char* to_string(Errc c);

struct Error {
  Errc code;
  std::string message;  // one line, no trailing period, names the offending input
  int sys_errno = 0;    // set for Errc::io and Errc::not_found from a system call
};

// An error from a failed system call on `what` (a path, usually); errno is read now.
NEFFCACHE_DECL Error sys_error(std::string_view op, std::string_view what, int err = errno);

// Either a T or an Error. Deliberately small: no monadic helpers, the call sites
// read as plain `if (!r) return r.error();`.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}
  bool has_value() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_{Errc::io, {}, 0};
  bool ok_ = true;
};

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/core/result.ipp>
#endif
