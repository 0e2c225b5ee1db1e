// Forwarding header: <neffcache/detail/sys.hpp> moved to <neffcache/core/detail/sys.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/core/detail/sys.hpp>
