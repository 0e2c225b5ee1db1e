// File helpers for tools: the ones the library uses itself, made public. The definitions
// live in core/detail/fs.hpp (where the library, the daemon and the tests name them as
// detail::); the contracts are these.
#pragma once

#include <neffcache/core/detail/fs.hpp>

namespace neffcache {

// Owns one file descriptor (move-only) and closes it on destruction; get() lends it,
// reset() closes it early. A negative descriptor is "none" (false).
using detail::UniqueFd;

// A whole regular file's bytes (opened as open_regular does, without following a link).
// Errors: a missing file is Errc::not_found, one that is not a regular file
// Errc::invalid_argument; a failed read is an error that names the path.
using detail::read_file;

// Writes every byte to `fd`, looping over short writes; `what` names the file in an
// error. The caller owns `fd`.
using detail::write_all;

// Writes `bytes` to a temporary file beside `path`, fsyncs it and renames it over
// `path`: readers see the old content or the new one, never a part. On any failure the
// temporary file is removed and `path` is untouched.
using detail::write_file_atomic;

// An environment variable's value, or `fallback` when it is unset or empty.
using detail::getenv_or;

}  // namespace neffcache
