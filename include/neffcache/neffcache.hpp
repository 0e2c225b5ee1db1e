// Everything of the neffcache library for custom tools. Link what the headers name:
// fmt, protobuf, OpenSSL's libcrypto, nlohmann-json (the CMake target
// neffcache::neffcache brings them all).
#pragma once

#include <neffcache/compile/batch.hpp>
#include <neffcache/core/clock.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/hlo/hlo.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/compile/runner.hpp>
#include <neffcache/compile/scheduler.hpp>
#include <neffcache/core/size.hpp>
#include <neffcache/cache/url.hpp>
