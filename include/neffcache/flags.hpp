// Forwarding header: <neffcache/flags.hpp> moved to <neffcache/cache/flags.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/cache/flags.hpp>
