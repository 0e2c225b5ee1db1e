// A separate process for cross-process lock tests.
//   lock_helper hold PATH MILLIS [STALE_MS [HOST]]  acquire, print "acquired", heartbeat
//                                                  until MILLIS pass, release
//   lock_helper contend PATH ROUNDS MARKER          ROUNDS times: acquire, create MARKER
//                                                  exclusively (exit 3 if it exists: two
//                                                  holders at once), remove it, release
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <neffcache/cache/lock.hpp>

using namespace std::chrono;
using neffcache::EntryLock;

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  std::string cmd = argv[1], path = argv[2];
  neffcache::LockOptions opts;
  opts.poll_interval = milliseconds(2);
  if (cmd == "hold") {
    if (argc > 4) opts.stale_after = milliseconds(std::atoi(argv[4]));
    if (argc > 5) {
      auto id = neffcache::detail::current_process();
      id.host = argv[5];
      opts.identity = id;
    }
    auto lock = EntryLock::acquire(path, steady_clock::now() + seconds(20), opts);
    if (!lock) return std::fprintf(stderr, "%s\n", lock.error().message.c_str()), 1;
    std::printf("acquired\n");
    std::fflush(stdout);
    auto end = steady_clock::now() + milliseconds(std::atoi(argv[3]));
    while (steady_clock::now() < end) {
      std::this_thread::sleep_for(opts.heartbeat_interval());
      if (!lock->heartbeat()) return 4;
    }
    return 0;
  }
  if (cmd == "contend" && argc == 5) {
    int rounds = std::atoi(argv[3]);
    for (int i = 0; i < rounds; ++i) {
      auto lock = EntryLock::acquire(path, steady_clock::now() + seconds(60), opts);
      if (!lock) return std::fprintf(stderr, "%s\n", lock.error().message.c_str()), 1;
      int fd = ::open(argv[4], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) return std::fprintf(stderr, "VIOLATION: two holders\n"), 3;
      ::close(fd);
      std::this_thread::sleep_for(microseconds(300));
      ::unlink(argv[4]);
    }
    return 0;
  }
  return 2;
}
