// Opens and reads a file the way a training process reads model.neff; the exit status
// tells the test how it went: 0 a whole fake NEFF, 2 a partial one, 3 another error,
// 4 EINTR, 5 EIO from the open, 6 EIO from a read. Prints when it called open and when open returned (CLOCK_REALTIME, in
// ns), so that a test can tell how long after the publish a waiter was answered.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <string>

#include "fake_neuronx_cc/fake_neff.hpp"

namespace {

void print_time(const char* what) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  std::printf("%s %lld\n", what, static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 64;
  print_time("start");
  int fd = ::open(argv[1], O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == EIO ? 5 : errno == EINTR ? 4 : 3;
  print_time("opened");
  std::string bytes;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) bytes.append(buf, static_cast<std::size_t>(n));
  if (n < 0) return errno == EIO ? 6 : 3;
  return neffcache::fake::parse_fake_neff(bytes) ? 0 : 2;
}
