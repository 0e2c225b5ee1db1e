// Forwarding header: <neffcache/hlo.hpp> moved to <neffcache/hlo/hlo.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/hlo/hlo.hpp>
