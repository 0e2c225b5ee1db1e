// The fuzz targets' bodies, shared by the libFuzzer binaries (fuzz_*.cpp) and by the
// regression test that replays every seed and every input a fuzzer ever found
// (tests/hlo/test_fuzz_inputs.cpp). Each one feeds untrusted bytes to a parser and checks
// what must hold for any input; a violated property aborts, which the fuzzer reports.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/hlo/hlo.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/lease.hpp>

namespace neffcache::fuzz {

[[noreturn]] inline void violated(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

inline bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();)
    if (detail::decode_utf8(s, i) < 0) return false;
  return true;
}

// A serialized HLO module, as a client would write model.hlo_module.pb. Any input gets
// an answer, and the same answer twice.
inline void hlo(std::string_view bytes) {
  auto a = analyze_hlo(bytes);
  auto b = analyze_hlo(bytes);
  if (a.has_value() != b.has_value()) violated("analyze_hlo is not deterministic");
  if (a && a->canonical_sha256 != b->canonical_sha256) violated("the canonical hash is not deterministic");
  if (a && a->canonical_sha256.size() != 64) violated("the canonical hash is not 64 hex digits");
}

// A list of flags that must survive compile_flags.json: written as json.dumps would,
// read back equal. (Bytes that are not UTF-8 become lone surrogates, which no JSON
// reader accepts; Python cannot write such a file either.)
inline void round_trip(const std::vector<std::string>& flags) {
  for (const auto& f : flags)
    if (!valid_utf8(f)) return;
  auto back = parse_compile_flags(python_json_list(flags));
  if (!back || *back != flags) violated("flags do not survive compile_flags.json");
  if (flags_hash(flags).size() != k_flags_hash_digits) violated("the flags hash has the wrong length");
}

// NEURON_CC_FLAGS as a user sets it.
inline void neuron_cc_flags(std::string_view text) {
  if (auto parsed = parse_neuron_cc_flags(text)) round_trip(parsed->compiler_flags);
}

// compile_flags.json as found in an entry.
inline void compile_flags_json(std::string_view text) {
  if (auto flags = parse_compile_flags(text)) round_trip(*flags);
}

// --compiler: a template that parses expands with no placeholder left.
inline void compiler_template(std::string_view text) {
  auto t = CompilerTemplate::parse(text);
  if (!t) return;
  auto words = t->expand({"/w/model.pb", "/w/model.neff", "/w", "MODULE_1+2", {"--a", "b c"}});
  if (words.empty()) violated("a template expanded to nothing");
  for (const auto& w : words)
    for (std::string_view p : {"{hlo}", "{neff}", "{workdir}", "{key}", "{flags}"})
      if (w.find(p) != std::string::npos) violated("a placeholder survived expansion");
}

// An S3 server's answer (or what a proxy made of it): an error document, a listing
// page, a lease record, the dates in headers. Any input gets an answer, the same twice;
// a lease record read back is the record written.
inline void s3_answer(std::string_view bytes) {
  std::string text(bytes);
  if (detail::s3_error_fields(text) != detail::s3_error_fields(text)) violated("s3_error_fields is not deterministic");
  auto a = detail::parse_listing(bytes);
  auto b = detail::parse_listing(bytes);
  if (a.has_value() != b.has_value()) violated("parse_listing is not deterministic");
  if (a && (a->listing.objects.size() != b->listing.objects.size() || a->next_token != b->next_token))
    violated("parse_listing is not deterministic");
  if (auto lease = detail::parse_lease(bytes)) {
    auto again = detail::parse_lease(detail::lease_json(*lease));
    if (!again || again->host != lease->host || again->pid != lease->pid || again->instance != lease->instance ||
        again->ttl != lease->ttl || again->released != lease->released || again->seq != lease->seq)
      violated("a lease record does not survive being written and read");
  }
  (void)detail::parse_http_date(text);
  (void)detail::parse_iso8601(text);
}

}  // namespace neffcache::fuzz
