// Forwarding header: <neffcache/size.hpp> moved to <neffcache/core/size.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/core/size.hpp>
