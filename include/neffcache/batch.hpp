// Forwarding header: <neffcache/batch.hpp> moved to <neffcache/compile/batch.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/compile/batch.hpp>
