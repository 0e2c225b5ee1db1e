// Forwarding header: <neffcache/key.hpp> moved to <neffcache/cache/key.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/cache/key.hpp>
