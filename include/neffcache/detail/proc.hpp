// Forwarding header: <neffcache/detail/proc.hpp> moved to <neffcache/core/detail/proc.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/core/detail/proc.hpp>
