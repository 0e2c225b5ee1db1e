// Everything of the neffcache library for custom tools. Link what the headers name:
// fmt, protobuf, OpenSSL's libcrypto, nlohmann-json (the CMake target
// neffcache::neffcache brings them all).
//
// The headers are grouped by concept, each layer including only its own and lower ones:
// core/ (results, clock, sizes, environment, system-call seam) < hlo/ (graph hashing) <
// cache/ (layout, locks, flags, keys, inventory, maintenance) < compile/ (runner,
// compile of one entry, scheduler, batches) < s3/ (client, leases, S3 caches, tier).
// The S3 headers (s3/) are included on their own.
#pragma once

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/location.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/cache/nki.hpp>
#include <neffcache/cache/url.hpp>
#include <neffcache/compile/batch.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/compile/hold.hpp>
#include <neffcache/compile/memory.hpp>
#include <neffcache/compile/peaks.hpp>
#include <neffcache/compile/pipeline.hpp>
#include <neffcache/compile/prepare.hpp>
#include <neffcache/compile/runner.hpp>
#include <neffcache/compile/scheduler.hpp>
#include <neffcache/core/clock.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/core/size.hpp>
#include <neffcache/hlo/hlo.hpp>
