# What an operator installs besides the programs, and the Debian package (issue 38):
#   cmake -S . -B build-package -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-package && (cd build-package && cpack -G DEB)
# gives neffcache_<version>_amd64.deb (scripts/package_check.sh installs it into a fresh
# bookworm root). CPack over dpkg-buildpackage: the build and its install rules are CMake's
# already, and a debian/ folder would say them a second time.
#
# - systemd units: neffcachefs.service (the cache at /var/tmp/neuron-compile-cache, settings in
#   <sysconfdir>/default/neffcachefs) and the template neffcachefs-lnl@.service (an LNL cache per
#   <sysconfdir>/neffcache/lnl/INSTANCE.conf), Type=notify. The package has no maintainer
#   scripts: nothing is enabled or started on install, nothing restarted on upgrade (opens
#   waiting for a compile would get EIO), and a purge removes the settings file only, never a
#   cache (the package owns no cache folder).
# - The stand-ins go to <prefix>/libexec/neffcache (tools/CMakeLists.txt).
# - Documents (README, docs/) and the copyright file go to <prefix>/share/doc/neffcache, the
#   LNL example to <prefix>/share/neffcache/examples.

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
# README.md beside docs/, as in the sources, so that its links hold.
configure_file(packaging/copyright.in ${PROJECT_BINARY_DIR}/debian/copyright @ONLY)
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
# Depends: what the binaries link, as dpkg-shlibdeps finds it (libfuse is linked statically when
# the private 3.17 is there, and then is no dependency), and fuse3 for fusermount3, which the
# units' ExecStopPost and unprivileged mounts run.
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
set(CPACK_STRIP_FILES ON)
# The version is read when cpack runs (cmake/cpack_version.cmake), from the build's version
# file: the commit the binaries were built from, not the one cmake was configured at.
set(NEFFCACHE_VERSION_FILE ${NEFFCACHE_VERSION_CPP}.txt)
configure_file(cmake/cpack_version.cmake.in ${PROJECT_BINARY_DIR}/cpack_version.cmake @ONLY)
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_BINARY_DIR}/cpack_version.cmake)
set(CPACK_GENERATOR DEB)
include(CPack)
