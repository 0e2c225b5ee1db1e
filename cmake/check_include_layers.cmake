# Include direction of the library's headers, run as the ctest test `include_layers`:
#   cmake -DINCLUDE_DIR=<repo>/include -P cmake/check_include_layers.cmake
#
# The layers, lowest first (a header may include its own layer and lower ones only):
#   core < hlo < cache < compile < s3 < store
#   core     results, clock, sizes, environment, the system-call seam, file helpers
#   hlo      reading and hashing HLO graphs
#   cache    the cache's layout, locks, flags, keys, URL, inventory, maintenance
#   compile  running a compiler on an entry, the scheduler, batches
#   s3       the S3 client, leases, S3 caches, sync, the local tier
#   store    one interface over a directory, an S3 cache and the local tier
# A layer's detail/ folder belongs to the layer. The umbrella, neffcache/neffcache.hpp, is the
# one header outside the layers and stands above them all: the flat paths of before the layers
# (<neffcache/layout.hpp>, <neffcache/detail/fs.hpp>, ...) were never released and are gone.
# And nothing under include/ reaches into the daemon (fuse/) or the tools (tools/):
# every include of <neffcache/...> must name a file under include/, and quoted
# includes, which is how fuse/ and tools/ files are reached, are not allowed.
cmake_minimum_required(VERSION 3.25)

set(layers core hlo cache compile s3 store)
if(NOT INCLUDE_DIR)
  message(FATAL_ERROR "pass -DINCLUDE_DIR=<repo>/include")
endif()

file(GLOB_RECURSE headers RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/neffcache/*")
set(problems "")
foreach(header IN LISTS headers)
  # The header's layer: the first folder under neffcache/.
  set(own -1)
  if(header MATCHES "^neffcache/([^/]+)/")
    list(FIND layers "${CMAKE_MATCH_1}" own)
    if(own EQUAL -1)
      string(APPEND problems "  ${header}: folder ${CMAKE_MATCH_1}/ is no known layer (${layers})\n")
      continue()
    endif()
  elseif(NOT header STREQUAL "neffcache/neffcache.hpp")
    string(APPEND problems "  ${header}: a header outside the layers (only the umbrella, neffcache.hpp, may be)\n")
    continue()
  endif()
  file(STRINGS "${INCLUDE_DIR}/${header}" lines REGEX "^[ \t]*#[ \t]*include")
  foreach(line IN LISTS lines)
    if(line MATCHES "#[ \t]*include[ \t]*\"([^\"]*)\"")
      string(APPEND problems "  ${header}: quoted include \"${CMAKE_MATCH_1}\" (the library includes <neffcache/...> only)\n")
      continue()
    endif()
    if(NOT line MATCHES "#[ \t]*include[ \t]*<neffcache/([^>]*)>")
      continue()  # a system or third-party header
    endif()
    set(target "${CMAKE_MATCH_1}")
    if(NOT EXISTS "${INCLUDE_DIR}/neffcache/${target}")
      string(APPEND problems "  ${header}: <neffcache/${target}> is not a library header (fuse/ or tools/?)\n")
      continue()
    endif()
    if(own EQUAL -1)
      continue()  # the umbrella includes every layer
    endif()
    set(theirs 999)  # a top-level header: above every layer
    if(target MATCHES "^([^/]+)/")
      list(FIND layers "${CMAKE_MATCH_1}" theirs)
    endif()
    if(theirs EQUAL -1 OR theirs GREATER own)
      list(GET layers ${own} own_name)
      string(APPEND problems "  ${header}: includes <neffcache/${target}>, above its layer ${own_name}\n")
    endif()
  endforeach()
endforeach()

string(REPLACE ";" " < " order "${layers}")
if(problems)
  message(FATAL_ERROR "include direction (${order}) broken:\n${problems}")
endif()
list(LENGTH headers count)
message(STATUS "include direction kept in ${count} headers (${order})")
