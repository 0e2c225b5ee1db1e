// Forwarding header: <neffcache/detail/process.hpp> moved to <neffcache/core/detail/process.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/core/detail/process.hpp>
