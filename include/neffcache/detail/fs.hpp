// Forwarding header: <neffcache/detail/fs.hpp> moved to <neffcache/core/detail/fs.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/core/detail/fs.hpp>
