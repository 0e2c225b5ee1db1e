// XXH3 checksums of files and descriptors (core/detail/xxh3.hpp): the one read loop that
// publication, verification and the content index share.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/core/detail/xxh3.hpp>

#include "support.hpp"

using namespace neffcache;

TEST_CASE("a descriptor hashes from its start like its file, and keeps its offset", "[xxh3]") {
  test::TempDir dir;
  // More than the 1 MiB read buffer, so that the loop goes round.
  std::string bytes((3 << 20) + 17, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 % 251);
  const auto path = dir.path() / "model.neff";
  test::spit(path, bytes);
  const uint64_t expected = XXH3_64bits(bytes.data(), bytes.size());

  CHECK(detail::file_xxh3(path.string()).value() == expected);
  detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd);
  REQUIRE(::lseek(fd.get(), 1000, SEEK_SET) == 1000);
  CHECK(detail::fd_xxh3(fd.get(), "model.neff").value() == expected);
  CHECK(::lseek(fd.get(), 0, SEEK_CUR) == 1000);
  CHECK(detail::xxh3_hex(expected).size() == 16);
  CHECK(detail::xxh3_hex(0x1f) == "000000000000001f");

  SECTION("a failed read is an error naming the file") {
    sys::ScopedFaultHook eio([](sys::Call c, std::string_view) { return c == sys::Call::read ? EIO : 0; });
    auto h = detail::fd_xxh3(fd.get(), "model.neff");
    REQUIRE_FALSE(h.has_value());
    CHECK(h.error().message.find("model.neff") != std::string::npos);
    CHECK_FALSE(detail::file_xxh3(path.string()).has_value());
  }
}
