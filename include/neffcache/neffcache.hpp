// Everything of the neffcache library for custom tools. Link what the headers name:
// fmt, protobuf, OpenSSL's libcrypto, nlohmann-json (the CMake target
// neffcache::neffcache brings them all).
#pragma once

#include <neffcache/batch.hpp>
#include <neffcache/clock.hpp>
#include <neffcache/compile.hpp>
#include <neffcache/flags.hpp>
#include <neffcache/hlo.hpp>
#include <neffcache/inventory.hpp>
#include <neffcache/key.hpp>
#include <neffcache/layout.hpp>
#include <neffcache/lock.hpp>
#include <neffcache/maintenance.hpp>
#include <neffcache/result.hpp>
#include <neffcache/runner.hpp>
#include <neffcache/scheduler.hpp>
#include <neffcache/size.hpp>
#include <neffcache/url.hpp>
