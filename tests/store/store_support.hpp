// Helpers of the store tests.
#pragma once

#include <map>
#include <string>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/store/store.hpp>

namespace test {

// Every entry of `s` by its path, with its state.
inline std::map<std::string, neffcache::EntryState> entry_states(const neffcache::store::Store& s) {
  auto entries = s.list();
  REQUIRE(entries.has_value());
  std::map<std::string, neffcache::EntryState> out;
  for (const auto& e : *entries) out[e.path] = e.state;
  return out;
}

}  // namespace test
