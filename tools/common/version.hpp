// The version of this build's programs (cmake/version.cmake says how it is made), which each
// program prints for --version and the metrics name (neffcache_build_info).
#pragma once

namespace neffcache {

// "0.1.0+git512.gd639ce2a01": the project's version, the commits of its history, the commit.
const char* program_version();

}  // namespace neffcache
