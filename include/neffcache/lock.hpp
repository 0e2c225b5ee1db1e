// Forwarding header: <neffcache/lock.hpp> moved to <neffcache/cache/lock.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/cache/lock.hpp>
