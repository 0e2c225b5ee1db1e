// Forwarding header: <neffcache/layout.hpp> moved to <neffcache/cache/layout.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/cache/layout.hpp>
