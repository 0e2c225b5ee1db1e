// Forwarding header: <neffcache/detail/hlo_schema.hpp> moved to <neffcache/hlo/detail/schema.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/hlo/detail/schema.hpp>
