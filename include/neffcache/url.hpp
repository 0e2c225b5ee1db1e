// Forwarding header: <neffcache/url.hpp> moved to <neffcache/cache/url.hpp> when the headers
// were grouped by concept. Kept until the next minor version; include the new path.
#pragma once

#include <neffcache/cache/location.hpp>
#include <neffcache/cache/url.hpp>
