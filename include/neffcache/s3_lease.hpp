// Forwarding header: <neffcache/s3_lease.hpp> moved to <neffcache/s3/lease.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/s3/lease.hpp>
