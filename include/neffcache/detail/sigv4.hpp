// Forwarding header: <neffcache/detail/sigv4.hpp> moved to <neffcache/s3/detail/sigv4.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/s3/detail/sigv4.hpp>
