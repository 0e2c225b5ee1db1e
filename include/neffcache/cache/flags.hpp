// NEURON_CC_FLAGS: splitting, the cache wrapper's own options, the flags hash and
// compile_flags.json, compatible byte for byte with the Neuron cache's Python code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/layout.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/digest.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// Splits NEURON_CC_FLAGS into words exactly as Python's shlex.split does (the Neuron
// wrapper is Python): blanks (space, tab, CR, LF) separate words; '...' is literal;
// inside "..." a backslash escapes only " and \; outside quotes a backslash keeps the
// next character literally (a newline too); '' and "" make an empty word; nothing is
// expanded and # is an ordinary character. An unterminated quote or a trailing
// backslash is an Errc::invalid_argument error naming the problem.
NEFFCACHE_DECL Result<std::vector<std::string>> shell_split(std::string_view line);

// The cache wrapper's own options. They select how the cache behaves, are never part
// of the flags hash and never reach the compiler.
struct WrapperOptions {
  std::optional<std::string> cache_dir;        // --cache_dir=URL | --cache_dir URL
  bool retry_failed_compilation = false;       // --retry_failed_compilation
  bool no_cache = false;                       // --no_cache
  std::optional<std::string> log_level;        // --log_level=LEVEL | --log_level LEVEL
  std::optional<std::string> compile_workdir;  // --compile_workdir=DIR | --compile_workdir DIR
  std::optional<std::string> dump;             // --dump[=VALUE]; "" when given bare
};

struct ParsedFlags {
  std::vector<std::string> compiler_flags;  // in order, wrapper options removed
  WrapperOptions wrapper;
};

// Separates wrapper options from compiler flags in an already split list. A wrapper
// option that needs a value and has none is an Errc::invalid_argument error.
NEFFCACHE_DECL Result<ParsedFlags> separate_wrapper_options(const std::vector<std::string>& words);

// shell_split followed by separate_wrapper_options: the whole NEURON_CC_FLAGS step.
inline Result<ParsedFlags> parse_neuron_cc_flags(std::string_view text) {
  auto words = shell_split(text);
  if (!words) return words.error();
  return separate_wrapper_options(*words);
}

namespace detail {

// Decodes one UTF-8 sequence at s[i] strictly (no overlong forms, no surrogates, at
// most U+10FFFF). Returns the code point and advances i, or returns -1 and leaves i.
NEFFCACHE_DECL int32_t decode_utf8(std::string_view s, std::size_t& i);

NEFFCACHE_DECL void append_json_escape(std::string& out, uint32_t unit);

}  // namespace detail

// One string as Python's json.dumps writes it with the default ensure_ascii=True.
// Bytes that are not valid UTF-8 become lone surrogates \udcXX, which is what Python
// produces for os.environ values (surrogateescape) and then dumps.
NEFFCACHE_DECL std::string python_json_string(std::string_view s);

// A list of strings exactly as Python's json.dumps(list) prints it: ["a", "b"].
NEFFCACHE_DECL std::string python_json_list(const std::vector<std::string>& items);

// Which historical form the flags hash is computed over.
enum class FlagsHashForm {
  json,    // md5(json.dumps(flags)): current releases; equals md5(compile_flags.json)
  legacy,  // md5(" ".join(flags)): older releases
};

inline constexpr std::size_t k_flags_hash_digits = 8;

// First 8 hex digits of the MD5 of the flags in the chosen form. The flags must
// already be free of wrapper options (see separate_wrapper_options).
NEFFCACHE_DECL std::string flags_hash(const std::vector<std::string>& flags,
                                      FlagsHashForm form = FlagsHashForm::json);

// Parses compile_flags.json content: a JSON list of strings, nothing else.
NEFFCACHE_DECL Result<std::vector<std::string>> parse_compile_flags(std::string_view text);

// Reads and parses a compile_flags.json file; a missing file is Errc::not_found.
NEFFCACHE_DECL Result<std::vector<std::string>> read_compile_flags(const std::string& path);

// The compiler flags a Neuron-dialect entry is compiled with: those of its
// compile_flags.json when `flags_file` names one, else `default_flags` (NEURON_CC_FLAGS of
// the daemon or tool), either way with the wrapper's own options removed
// (separate_wrapper_options). Of any entry, either dialect: entry_compiler_flags (lnl.hpp).
// Errors, so that a caller can tell the two apart: the file cannot be read (Errc::io,
// or Errc::not_found if it went meanwhile), which may pass; or the entry's own fault,
// contents that are no list of strings (Errc::bad_flags_file) or a wrapper option
// without its value (Errc::invalid_argument). Messages from the file name it.
NEFFCACHE_DECL Result<std::vector<std::string>> neuron_compiler_flags(const std::optional<std::string>& flags_file,
                                                                      const std::vector<std::string>& default_flags);

// Writes compile_flags.json atomically, in json.dumps form, so that the MD5 of the
// file equals the entry's flags hash (the JSON form) as in the Neuron cache.
inline Result<void> write_compile_flags(const std::string& path,
                                        const std::vector<std::string>& flags) {
  return detail::write_file_atomic(path, python_json_list(flags));
}

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/flags.ipp>
#endif
