// Forwarding header: <neffcache/scheduler.hpp> moved to <neffcache/compile/scheduler.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/compile/scheduler.hpp>
// prepare_job lived in scheduler.hpp before it moved to compile/prepare.hpp.
#include <neffcache/compile/prepare.hpp>
