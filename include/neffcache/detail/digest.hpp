// Forwarding header: <neffcache/detail/digest.hpp> moved to <neffcache/core/detail/digest.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/core/detail/digest.hpp>
