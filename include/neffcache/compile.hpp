// Forwarding header: <neffcache/compile.hpp> moved to <neffcache/compile/compile.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/compile/compile.hpp>
