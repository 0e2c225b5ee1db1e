// Forwarding header: <neffcache/inventory.hpp> moved to <neffcache/cache/inventory.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/cache/inventory.hpp>
