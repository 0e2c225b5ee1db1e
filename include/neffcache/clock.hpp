// Forwarding header: <neffcache/clock.hpp> moved to <neffcache/core/clock.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/core/clock.hpp>
