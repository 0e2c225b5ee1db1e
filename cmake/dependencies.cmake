# The libraries the code needs, and how our programs link them.
#
# The header-only library names its dependencies as its users find them on their own systems
# (cmake/neffcacheConfig.cmake.in repeats the list): that is the library's install interface.
# Our programs, tests and benchmarks link them through neffcache_deps instead, which
# NEFFCACHE_PORTABLE chooses:
# - ON (the default where it can be: not in the sanitizer and fuzzing builds, on a host whose glibc
#   is no newer than Debian 12's, with the private libraries there): one build of the programs loads on
#   every target of the packages (Debian 12 and 13, Ubuntu 22.04 and 24.04, Amazon Linux 2023;
#   docs/INSTALL.md). What the targets do not share under one soname and version node is linked
#   in: fmt (header-only), protobuf (Debian's libprotobuf.a), tinyxml2 and libcurl (HTTP and HTTPS
#   over the system's OpenSSL only; both built by scripts/private_libs.sh from Debian's source
#   packages) and libstdc++. Left dynamic: glibc, libcrypto and libssl 3, libarchive, zlib, and
#   libgcc_s, the unwinder: linked in (-static-libgcc), GCC 12's calls _dl_find_object, which
#   glibc 2.35 added (Amazon Linux 2023 has 2.34), and libgcc_s.so.1 is on every target (glibc
#   itself loads it; Debian's libc6 depends on it). libstdc++.a's one need of glibc 2.36,
#   arc4random, is defined in each program (tools/common/glibc_compat.cpp). The test elf_portable
#   reads what the installed programs need. The packages are built on Debian 12: a newer glibc
#   (Debian 13's 2.41) makes every unit call strtol and sscanf at GLIBC_2.38 (C23's versions),
#   and its libstdc++.a and libprotobuf.a were built so too.
# - OFF: the system's shared libraries, as the sanitizers need (their runtimes intercept the C++
#   library's allocations), and as a build for its own host needs no more.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Protobuf REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto SSL)
find_package(CURL REQUIRED)      # S3 (s3/http.hpp)
find_package(tinyxml2 REQUIRED)  # S3's XML answers (s3/client.hpp)
find_package(CLI11 REQUIRED)     # the programs' command lines

set(NEFFCACHE_CURL_PREFIX /opt/neffcache/curl CACHE PATH "the static libcurl that scripts/setup.sh builds (NEFFCACHE_PORTABLE)")
set(NEFFCACHE_TINYXML2_PREFIX /opt/neffcache/tinyxml2 CACHE PATH "the static tinyxml2 that scripts/setup.sh builds (NEFFCACHE_PORTABLE)")
execute_process(COMMAND getconf GNU_LIBC_VERSION OUTPUT_VARIABLE host_glibc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
string(REGEX REPLACE "^glibc " "" host_glibc "${host_glibc}")
set(portable_default ON)
if(NEFFCACHE_SANITIZE OR NEFFCACHE_TSAN OR NEFFCACHE_FUZZ)
  set(portable_default OFF)
  set(portable_refused "the sanitizers and libFuzzer need the system's shared C++ library")
elseif(host_glibc VERSION_GREATER 2.36)
  set(portable_default OFF)
  set(portable_refused "this host's glibc ${host_glibc} is newer than Debian 12's 2.36: the programs would need it")
elseif(NOT EXISTS ${NEFFCACHE_CURL_PREFIX}/.neffcache-private OR NOT EXISTS ${NEFFCACHE_TINYXML2_PREFIX}/.neffcache-private)
  # (whole prefixes of scripts/private_libs.sh, as setup.sh asks)
  set(portable_default OFF)
endif()
option(NEFFCACHE_PORTABLE "Link the programs so that one build runs on every target of the packages" ${portable_default})
if(NEFFCACHE_PORTABLE AND portable_refused)
  message(FATAL_ERROR "NEFFCACHE_PORTABLE: ${portable_refused}; configure with -DNEFFCACHE_PORTABLE=OFF")
endif()
message(STATUS "NEFFCACHE_PORTABLE: ${NEFFCACHE_PORTABLE}")

add_library(neffcache_deps INTERFACE)
if(NEFFCACHE_PORTABLE)
  # static_library(TARGET FILE INCLUDE_DIR LINKS...): an imported static library.
  function(static_library target file include)
    if(NOT EXISTS "${file}")
      message(FATAL_ERROR "${file} is missing: NEFFCACHE_PORTABLE links it in. Run scripts/setup.sh as root, "
                          "or configure with -DNEFFCACHE_PORTABLE=OFF to link the system's shared libraries")
    endif()
    add_library(${target} STATIC IMPORTED)
    set_target_properties(${target} PROPERTIES IMPORTED_LOCATION "${file}" INTERFACE_INCLUDE_DIRECTORIES "${include}"
                                               INTERFACE_LINK_LIBRARIES "${ARGN}")
  endfunction()
  static_library(neffcache_curl ${NEFFCACHE_CURL_PREFIX}/lib/libcurl.a ${NEFFCACHE_CURL_PREFIX}/include
                 OpenSSL::SSL OpenSSL::Crypto Threads::Threads)
  set_property(TARGET neffcache_curl PROPERTY INTERFACE_COMPILE_DEFINITIONS CURL_STATICLIB)
  static_library(neffcache_tinyxml2 ${NEFFCACHE_TINYXML2_PREFIX}/lib/libtinyxml2.a ${NEFFCACHE_TINYXML2_PREFIX}/include)
  find_package(ZLIB REQUIRED)
  get_filename_component(protobuf_dir "${Protobuf_LIBRARY}" DIRECTORY)
  static_library(neffcache_protobuf ${protobuf_dir}/libprotobuf.a "${Protobuf_INCLUDE_DIRS}" ZLIB::ZLIB Threads::Threads)
  target_link_libraries(neffcache_deps INTERFACE fmt::fmt-header-only nlohmann_json::nlohmann_json neffcache_protobuf
                        OpenSSL::Crypto neffcache_curl neffcache_tinyxml2)
  target_link_options(neffcache_deps INTERFACE -static-libstdc++)
  set(NEFFCACHE_PROTOBUF neffcache_protobuf)
else()
  target_link_libraries(neffcache_deps INTERFACE fmt::fmt nlohmann_json::nlohmann_json protobuf::libprotobuf
                        OpenSSL::Crypto CURL::libcurl tinyxml2::tinyxml2)
  set(NEFFCACHE_PROTOBUF protobuf::libprotobuf)
endif()
