# What an operator installs besides the programs, and the packages (issues 38 and 57), all from
# one build:
#   cmake -S . -B build-package -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-package && (cd build-package && cpack)
# gives neffcache_<version>_amd64.deb (Debian 12 and 13, Ubuntu 22.04 and 24.04),
# neffcache-<version>-1.x86_64.rpm (Amazon Linux 2023) and neffcache-<version>-Linux-x86_64.tar.gz
# (the same files under usr/ and etc/). The programs load on each (NEFFCACHE_PORTABLE,
# cmake/dependencies.cmake). scripts/package_check.sh installs the .deb into fresh Debian 12 and
# 13 roots. CPack over dpkg-buildpackage and rpmbuild specs: the build and its install rules are
# CMake's already, and a debian/ folder or a spec would say them a second time.
#
# - systemd units: neffcachefs.service (the cache at /var/tmp/neuron-compile-cache, settings in
#   <sysconfdir>/default/neffcachefs) and the template neffcachefs-lnl@.service (an LNL cache per
#   <sysconfdir>/neffcache/lnl/INSTANCE.conf), Type=notify, in <prefix>/lib/systemd/system, where
#   both families look. The packages have no maintainer scripts: nothing is enabled or started on
#   install, nothing restarted on upgrade (opens waiting for a compile would get EIO), and a purge
#   removes the settings file only, never a cache (the packages own no cache folder).
# - The stand-ins go to <prefix>/libexec/neffcache (tools/CMakeLists.txt).
# - Documents (README, docs/), the copyright file and the licences of the libraries the programs
#   carry go to <prefix>/share/doc/neffcache, the LNL example to <prefix>/share/neffcache/examples.

# <prefix>/etc, except for the prefix /usr, whose settings live in /etc (as GNUInstallDirs says).
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(neffcache_etc ${CMAKE_INSTALL_FULL_SYSCONFDIR})
else()
  set(neffcache_etc ${CMAKE_INSTALL_SYSCONFDIR})
endif()
set(NEFFCACHE_DEFAULTS_FILE ${CMAKE_INSTALL_FULL_SYSCONFDIR}/default/neffcachefs)
set(NEFFCACHE_LNL_DIR ${CMAKE_INSTALL_FULL_SYSCONFDIR}/neffcache/lnl)
set(NEFFCACHE_EXAMPLES_DIR ${CMAKE_INSTALL_FULL_DATADIR}/neffcache/examples)
foreach(unit neffcachefs.service neffcachefs-lnl@.service)
  configure_file(packaging/systemd/${unit}.in ${PROJECT_BINARY_DIR}/systemd/${unit} @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/systemd/${unit} DESTINATION lib/systemd/system)
endforeach()
install(FILES packaging/neffcachefs.default DESTINATION ${neffcache_etc}/default RENAME neffcachefs)
install(DIRECTORY DESTINATION ${neffcache_etc}/neffcache/lnl)
# (The example is not under doc/: images that leave documentation out keep it.)
install(FILES packaging/lnl-vllm.conf DESTINATION ${CMAKE_INSTALL_DATADIR}/neffcache/examples)
# The copyright file names every library the programs carry (linked in, or compiled in from its
# headers), with its licence; beside it, in licenses/, each one's copyright file as Debian gives
# it (holders and licence texts).
set(NEFFCACHE_CARRIED "")
# carried(NAME VERSION LICENCE COPYRIGHT_FILE WHAT)
function(carried name version licence file what)
  if(NOT EXISTS "${file}")
    message(WARNING "${file} is missing: the package's copyright file will not carry ${name}'s licence")
    return()
  endif()
  if(licence STREQUAL "")
    string(APPEND NEFFCACHE_CARRIED " - ${what}: licenses/${name}\n")
  elseif(version STREQUAL "")
    string(APPEND NEFFCACHE_CARRIED " - ${name} (${licence}): ${what}; licenses/${name}\n")
  else()
    string(APPEND NEFFCACHE_CARRIED " - ${name} ${version} (${licence}): ${what}; licenses/${name}\n")
  endif()
  set(NEFFCACHE_CARRIED "${NEFFCACHE_CARRIED}" PARENT_SCOPE)
  install(FILES "${file}" DESTINATION ${CMAKE_INSTALL_DOCDIR}/licenses RENAME ${name})
endfunction()
# pkgconfig_version(VAR FILE): the Version of a pkg-config file.
function(pkgconfig_version var file)
  file(STRINGS "${file}" line REGEX "^Version:")
  string(REPLACE "Version: " "" line "${line}")
  set(${var} "${line}" PARENT_SCOPE)
endfunction()
set(compiled_in "compiled in from its headers")
carried(CLI11 "${CLI11_VERSION}" BSD-3-Clause /usr/share/doc/libcli11-dev/copyright "${compiled_in}")
carried(nlohmann-json "${nlohmann_json_VERSION}" MIT /usr/share/doc/nlohmann-json3-dev/copyright "${compiled_in}")
carried(xxHash "" BSD-2-Clause /usr/share/doc/libxxhash-dev/copyright "${compiled_in}")
if(NEFFCACHE_PORTABLE)
  carried(fmt "${fmt_VERSION}" MIT /usr/share/doc/libfmt-dev/copyright "${compiled_in}")
  carried(protobuf "${Protobuf_VERSION}" BSD-3-Clause /usr/share/doc/libprotobuf-dev/copyright "linked in (Debian's libprotobuf.a)")
  pkgconfig_version(curl_version ${NEFFCACHE_CURL_PREFIX}/lib/pkgconfig/libcurl.pc)
  carried(libcurl "${curl_version}" curl ${NEFFCACHE_CURL_PREFIX}/share/doc/curl/copyright
          "linked in (built from Debian's source package by scripts/private_libs.sh)")
  pkgconfig_version(tinyxml2_version ${NEFFCACHE_TINYXML2_PREFIX}/lib/pkgconfig/tinyxml2.pc)
  carried(tinyxml2 "${tinyxml2_version}" Zlib ${NEFFCACHE_TINYXML2_PREFIX}/share/doc/tinyxml2/copyright
          "linked in (built from Debian's source package by scripts/private_libs.sh)")
  set(gcc_version "")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(gcc_version ${CMAKE_CXX_COMPILER_VERSION})
  endif()
  carried(libstdc++ "${gcc_version}" "GPL-3.0-or-later WITH GCC-exception-3.1" /usr/share/doc/libstdc++6/copyright
          "linked in; the GCC Runtime Library Exception allows it")
  carried(GPL-3 "" "" /usr/share/common-licenses/GPL-3 "the licence text the exception of libstdc++ refers to")
endif()
if(NEFFCACHE_LIBFUSE_STATIC)
  carried(libfuse "${NEFFCACHE_LIBFUSE_VERSION}" LGPL-2.1 ${NEFFCACHE_LIBFUSE_PREFIX}/share/doc/fuse3/copyright
          "linked into neffcachefs (built from Debian's source package by scripts/private_libs.sh)")
  carried(LGPL-2.1 "" "" /usr/share/common-licenses/LGPL-2.1 "libfuse's licence text")
endif()
configure_file(packaging/copyright.in ${PROJECT_BINARY_DIR}/debian/copyright @ONLY)
# README.md beside docs/, as in the sources, so that its links hold.
install(FILES README.md ${PROJECT_BINARY_DIR}/debian/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs FILES_MATCHING PATTERN "*.md" PATTERN man EXCLUDE)

set(CPACK_PACKAGE_NAME neffcache)
set(CPACK_PACKAGE_VENDOR "the neffcache developers")
set(CPACK_PACKAGE_CONTACT "the neffcache developers <neffcache@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "compile cache for AWS Neuron that compiles a missing NEFF when it is opened")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
    "neffcache is a compile cache for AWS Trainium and Inferentia, drop-in compatible with the Neuron persistent "
    "cache (torch-xla, libneuronxla) and the cache of vLLM Neuron and TorchNeuron. neffcachefs mounts a cache so "
    "that opening a missing NEFF compiles its graph once; neffcache administers caches (folders and S3 buckets); "
    "neuron_parallel_compile is a drop-in for the Neuron tool; neffcache-cc puts the cache in front of neuronx-cc. "
    "Also the header-only C++ library with its CMake package. The stand-ins fake-neuronx-cc and neuron-client-sim, "
    "for demos and tests, are in /usr/libexec/neffcache.")
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends: what the binaries link, as dpkg-shlibdeps finds it (libc6, libgcc-s1, libssl3,
# libarchive13: the names hold on Debian 12 and 13 and Ubuntu 22.04 and 24.04, where the t64
# packages provide the old names; what is linked in is no dependency), and fuse3 for fusermount3, which
# the units' ExecStopPost and unprivileged mounts run.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "fuse3")
# The headers need these to build a tool against (find_package(neffcache)); a host that only
# runs the programs does not.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS
    "libfmt-dev, nlohmann-json3-dev, libprotobuf-dev, libssl-dev, libcurl4-openssl-dev, libtinyxml2-dev, libxxhash-dev")
# The settings file is the operator's: an upgrade keeps their changes, a purge removes it.
file(WRITE ${PROJECT_BINARY_DIR}/debian/conffiles "${NEFFCACHE_DEFAULTS_FILE}\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/conffiles)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)

# The rpm (Amazon Linux 2023): Requires as rpmbuild computes them from the binaries (libc.so.6,
# libcrypto.so.3, ... with their versions), plus fuse3. Its folders that the system's packages
# own are left out of its file list.
set(CPACK_RPM_PACKAGE_LICENSE "LicenseRef-not-chosen AND LGPL-2.1-only AND MIT AND BSD-3-Clause AND BSD-2-Clause AND Zlib AND curl AND GPL-3.0-or-later WITH GCC-exception-3.1")
set(CPACK_RPM_PACKAGE_GROUP "System Environment/Daemons")
set(CPACK_RPM_PACKAGE_AUTOREQ ON)
set(CPACK_RPM_PACKAGE_REQUIRES "fuse3")
set(CPACK_RPM_USER_FILELIST "%config(noreplace) ${NEFFCACHE_DEFAULTS_FILE}")
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION /etc/default /usr/lib/systemd /usr/lib/systemd/system
    /usr/libexec /usr/share/cmake /usr/share/man /usr/share/man/man1 /usr/share/man/man8)
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
# The tarball: the same files, under usr/ and etc/ as they would be installed.
set(CPACK_SET_DESTDIR ON)

set(CPACK_STRIP_FILES ON)
# The version is read when cpack runs (cmake/cpack_version.cmake), from the build's version
# file: the commit the binaries were built from, not the one cmake was configured at.
set(NEFFCACHE_VERSION_FILE ${NEFFCACHE_VERSION_CPP}.txt)
configure_file(cmake/cpack_version.cmake.in ${PROJECT_BINARY_DIR}/cpack_version.cmake @ONLY)
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_BINARY_DIR}/cpack_version.cmake)
# The rpm where rpmbuild is (Debian's rpm package; scripts/package_check.sh installs it).
find_program(NEFFCACHE_RPMBUILD rpmbuild)
if(NEFFCACHE_RPMBUILD)
  set(CPACK_GENERATOR DEB RPM TGZ)
else()
  set(CPACK_GENERATOR DEB TGZ)
endif()
include(CPack)
