// Forwarding header: <neffcache/maintenance.hpp> moved to <neffcache/cache/maintenance.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/cache/maintenance.hpp>
