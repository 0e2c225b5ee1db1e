// Forwarding header: <neffcache/runner.hpp> moved to <neffcache/compile/runner.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/compile/runner.hpp>
