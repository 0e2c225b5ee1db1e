// Forwarding header: <neffcache/detail/hlo_canon.hpp> moved to <neffcache/hlo/detail/canon.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/hlo/detail/canon.hpp>
