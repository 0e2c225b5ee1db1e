// Forwarding header: <neffcache/result.hpp> moved to <neffcache/core/result.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/core/result.hpp>
