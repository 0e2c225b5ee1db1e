// How the library's functions are defined: in a header-only build (a user's program, the default)
// or compiled once (this project's own programs and tests).
//
// A header declares its functions and includes, at its end, the definitions that live in the
// .ipp file beside it (s3/tier.hpp, s3/tier.ipp). Those definitions are marked NEFFCACHE_DECL:
// `inline` in a header-only build, so that every unit may hold them. A build that defines
// NEFFCACHE_SEPARATE_COMPILATION compiles each .ipp file once, as a unit of its own, and its
// headers leave them out: a unit that includes the library then parses declarations only, instead
// of instantiating fmt's and nlohmann-json's templates for every function of the library again.
// (The trade is fmt's and asio's: the user's build stays one `#include`; ours compiles each
// definition once.) Templates, constexpr functions and one-line members stay in the header.
#pragma once

#ifdef NEFFCACHE_SEPARATE_COMPILATION
#define NEFFCACHE_DECL
#else
#define NEFFCACHE_DECL inline
#endif
