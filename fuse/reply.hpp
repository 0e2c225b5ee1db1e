// What a handler answers, and the answers that come later. Handlers (fs*.cpp and the
// parts) never call libfuse's fuse_reply_* functions: they return an Answer, which
// lowlevel.cpp turns into the reply. A request kept for later (an open waiting on a
// compile, a lock waiting for its holder) is answered through a Later, which lowlevel.cpp
// makes of the request, so one file is the only caller of libfuse's reply functions (as
// mountpoint-s3 keeps them in fuse.rs), and the handlers run without a mount in tests.
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

// The request was kept; it is answered later, exactly once, through its Later.
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

// A request whose answer comes later, from another thread: answered exactly once, by
// fail or opened.
class Later {
 public:
  virtual ~Later() = default;
  // Answers with an errno (0: a success without a value).
  virtual void fail(int err) = 0;
  // Answers an open with `fi`: fi.fh is the kernel's from then on (closed here if the
  // answer cannot be delivered; it is closed at the open's RELEASE otherwise).
  virtual void opened(const fuse_file_info& fi) = 0;
  // Whether the caller gave up (an interrupt, a signal).
  virtual bool interrupted() = 0;
  // Calls `f(data)` when the caller gives up (at once if it has). Once per request.
  virtual void on_interrupt(void (*f)(void* data), void* data) = 0;
};

// After a placeholder's file was produced: the kernel drops placeholder `ino`'s cached
// attributes and the name `name` in folder `parent`, so later lookups find the real
// file. Never from inside a handler (libfuse documents that as a deadlock); a null
// session (no mount, in tests) does nothing.
void notify_produced(fuse_session* se, fuse_ino_t ino, fuse_ino_t parent, const std::string& name);
// Tells the kernel that the folder `ino` changed behind its back: it drops the folder's
// attributes and the listing it keeps. Not from a handler (libfuse: a deadlock).
void notify_changed(fuse_session* se, fuse_ino_t ino);

}  // namespace neffcachefs
