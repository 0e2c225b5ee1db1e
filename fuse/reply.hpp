// What a handler answers, and the replies that come later. Handlers (fs*.cpp and the
// parts) never call libfuse's fuse_reply_* functions: they return an Answer, which
// lowlevel.cpp turns into the reply. A request kept for later (an open waiting on a
// compile, a lock waiting for its holder) is answered through the reply_*_later
// functions below, which lowlevel.cpp defines too, so one file is the only caller of
// libfuse's reply functions (as mountpoint-s3 keeps them in fuse.rs).
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <string>
#include <utility>
#include <variant>

namespace neffcachefs {

// A failed request: the errno the client gets. Never 0.
struct Errno {
  int value;
};

// The request was kept; it is answered later, exactly once, through a reply_*_later.
struct Deferred {};

// A success without a value.
struct Ok {};

// A handler's answer: a value, an errno, or "answered later".
template <class T>
class Answer {
 public:
  Answer(T value) : v_(std::move(value)) {}  // NOLINT: implicit, as a return value
  Answer(Errno e) : v_(e) {}                 // NOLINT
  Answer(Deferred d) : v_(d) {}              // NOLINT

  bool deferred() const { return std::holds_alternative<Deferred>(v_); }
  // The errno, or 0 for a value (and for Deferred).
  int error() const { return std::holds_alternative<Errno>(v_) ? std::get<Errno>(v_).value : 0; }
  bool ok() const { return std::holds_alternative<T>(v_); }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }

 private:
  std::variant<T, Errno, Deferred> v_;
};

// Replies to a kept request (defined in lowlevel.cpp). reply_open_later hands fi.fh to
// the kernel (closed at the open's RELEASE); if the request is gone, it closes it.
void reply_err_later(fuse_req_t req, int err);
void reply_open_later(fuse_req_t req, const fuse_file_info& fi);

// After a placeholder's file was produced: the kernel drops placeholder `ino`'s cached
// attributes and the name `name` in folder `parent`, so later lookups find the real
// file. Never from inside a handler (libfuse documents that as a deadlock); a null
// session (no mount, in tests) does nothing.
void notify_produced(fuse_session* se, fuse_ino_t ino, fuse_ino_t parent, const std::string& name);

}  // namespace neffcachefs
