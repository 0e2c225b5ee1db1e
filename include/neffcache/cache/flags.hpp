// NEURON_CC_FLAGS: splitting, the cache wrapper's own options, the flags hash and
// compile_flags.json, compatible byte for byte with the Neuron cache's Python code.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/layout.hpp>
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
inline Result<std::vector<std::string>> shell_split(std::string_view line) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      if (in_word) words.push_back(std::move(cur)), cur.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      auto end = line.find('\'', i + 1);
      if (end == std::string_view::npos)
        return Error{Errc::invalid_argument, "unterminated single quote in flags"};
      cur.append(line.substr(i + 1, end - i - 1));
      i = end;
    } else if (c == '"') {
      for (++i;; ++i) {
        if (i >= line.size())
          return Error{Errc::invalid_argument, "unterminated double quote in flags"};
        if (line[i] == '"') break;
        if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == '"' || line[i + 1] == '\\')) ++i;
        cur.push_back(line[i]);
      }
    } else if (c == '\\') {
      if (++i >= line.size()) return Error{Errc::invalid_argument, "trailing backslash in flags"};
      cur.push_back(line[i]);
    } else {
      cur.push_back(c);
    }
  }
  if (in_word) words.push_back(std::move(cur));
  return words;
}

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
inline Result<ParsedFlags> separate_wrapper_options(const std::vector<std::string>& words) {
  ParsedFlags out;
  auto& w = out.wrapper;
  struct Valued {
    std::string_view name;
    std::optional<std::string>* slot;
  };
  const std::array<Valued, 3> valued{{{"--cache_dir", &w.cache_dir},
                                      {"--log_level", &w.log_level},
                                      {"--compile_workdir", &w.compile_workdir}}};
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string_view word = words[i];
    std::string_view name = word.substr(0, word.find('='));
    bool has_eq = name.size() != word.size();
    std::string_view value = has_eq ? word.substr(name.size() + 1) : std::string_view{};
    bool handled = false;
    for (const auto& v : valued) {
      if (name != v.name) continue;
      if (!has_eq) {
        if (i + 1 >= words.size())
          return Error{Errc::invalid_argument, fmt::format("{} needs a value", v.name)};
        value = words[++i];
      }
      *v.slot = std::string(value);
      handled = true;
    }
    if (handled) continue;
    if (word == "--retry_failed_compilation") {
      w.retry_failed_compilation = true;
    } else if (word == "--no_cache") {
      w.no_cache = true;
    } else if (name == "--dump") {
      w.dump = std::string(value);
    } else {
      out.compiler_flags.emplace_back(word);
    }
  }
  return out;
}

// shell_split followed by separate_wrapper_options: the whole NEURON_CC_FLAGS step.
inline Result<ParsedFlags> parse_neuron_cc_flags(std::string_view text) {
  auto words = shell_split(text);
  if (!words) return words.error();
  return separate_wrapper_options(*words);
}

namespace detail {

// Decodes one UTF-8 sequence at s[i] strictly (no overlong forms, no surrogates, at
// most U+10FFFF). Returns the code point and advances i, or returns -1 and leaves i.
inline int32_t decode_utf8(std::string_view s, std::size_t& i) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return ++i, c;
  int len;
  uint32_t cp;
  uint32_t min;
  if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, min = 0x10000;
  else return -1;
  if (i + static_cast<std::size_t>(len) > s.size()) return -1;
  for (int k = 1; k < len; ++k) {
    unsigned char d = b(i + static_cast<std::size_t>(k));
    if ((d & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  i += static_cast<std::size_t>(len);
  return static_cast<int32_t>(cp);
}

inline void append_json_escape(std::string& out, uint32_t unit) {
  fmt::format_to(std::back_inserter(out), "\\u{:04x}", unit);
}

}  // namespace detail

// One string as Python's json.dumps writes it with the default ensure_ascii=True.
// Bytes that are not valid UTF-8 become lone surrogates \udcXX, which is what Python
// produces for os.environ values (surrogateescape) and then dumps.
inline std::string python_json_string(std::string_view s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    int32_t cp = detail::decode_utf8(s, i);
    if (cp < 0) {
      detail::append_json_escape(out, 0xDC00u + static_cast<unsigned char>(s[i++]));
      continue;
    }
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp >= 0x20 && cp < 0x7F) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x10000) {
      detail::append_json_escape(out, static_cast<uint32_t>(cp));
    } else {
      uint32_t v = static_cast<uint32_t>(cp) - 0x10000;
      detail::append_json_escape(out, 0xD800 + (v >> 10));
      detail::append_json_escape(out, 0xDC00 + (v & 0x3FF));
    }
  }
  out += '"';
  return out;
}

// A list of strings exactly as Python's json.dumps(list) prints it: ["a", "b"].
inline std::string python_json_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += python_json_string(items[i]);
  }
  out += ']';
  return out;
}

// Which historical form the flags hash is computed over.
enum class FlagsHashForm {
  json,    // md5(json.dumps(flags)): current releases; equals md5(compile_flags.json)
  legacy,  // md5(" ".join(flags)): older releases
};

inline constexpr std::size_t k_flags_hash_digits = 8;

// First 8 hex digits of the MD5 of the flags in the chosen form. The flags must
// already be free of wrapper options (see separate_wrapper_options).
inline std::string flags_hash(const std::vector<std::string>& flags,
                              FlagsHashForm form = FlagsHashForm::json) {
  std::string text;
  if (form == FlagsHashForm::json) {
    text = python_json_list(flags);
  } else {
    for (std::size_t i = 0; i < flags.size(); ++i) (i ? text += ' ' : text) += flags[i];
  }
  return detail::md5_hex(text).substr(0, k_flags_hash_digits);
}


// Parses compile_flags.json content: a JSON list of strings, nothing else.
inline Result<std::vector<std::string>> parse_compile_flags(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return Error{Errc::bad_flags_file, "compile_flags.json is not valid JSON"};
  if (!j.is_array())
    return Error{Errc::bad_flags_file, "compile_flags.json is not a JSON list"};
  std::vector<std::string> flags;
  flags.reserve(j.size());
  for (const auto& item : j) {
    if (!item.is_string())
      return Error{Errc::bad_flags_file,
                   fmt::format("compile_flags.json holds a {} where a string belongs",
                               item.type_name())};
    flags.push_back(item.get<std::string>());
  }
  return flags;
}

// Reads and parses a compile_flags.json file; a missing file is Errc::not_found.
inline Result<std::vector<std::string>> read_compile_flags(const std::string& path) {
  auto text = detail::read_file(path);
  if (!text) return text.error();
  auto flags = parse_compile_flags(*text);
  if (!flags) return Error{flags.error().code, fmt::format("{}: {}", path, flags.error().message)};
  return flags;
}

// The compiler flags a Neuron-dialect entry is compiled with: those of its
// compile_flags.json when `flags_file` names one, else `default_flags` (NEURON_CC_FLAGS of
// the daemon or tool), either way with the wrapper's own options removed
// (separate_wrapper_options). Of any entry, either dialect: entry_compiler_flags (lnl.hpp).
// Errors, so that a caller can tell the two apart: the file cannot be read (Errc::io,
// or Errc::not_found if it went meanwhile), which may pass; or the entry's own fault,
// contents that are no list of strings (Errc::bad_flags_file) or a wrapper option
// without its value (Errc::invalid_argument). Messages from the file name it.
inline Result<std::vector<std::string>> neuron_compiler_flags(const std::optional<std::string>& flags_file,
                                                              const std::vector<std::string>& default_flags) {
  std::optional<std::vector<std::string>> from_file;
  if (flags_file) {
    auto read = read_compile_flags(*flags_file);
    if (!read) return read.error();
    from_file = std::move(*read);
  }
  auto parsed = separate_wrapper_options(from_file ? *from_file : default_flags);
  if (!parsed) {
    if (!flags_file) return parsed.error();
    return Error{parsed.error().code, fmt::format("{}: {}", *flags_file, parsed.error().message)};
  }
  return std::move(parsed->compiler_flags);
}

// Writes compile_flags.json atomically, in json.dumps form, so that the MD5 of the
// file equals the entry's flags hash (the JSON form) as in the Neuron cache.
inline Result<void> write_compile_flags(const std::string& path,
                                        const std::vector<std::string>& flags) {
  return detail::write_file_atomic(path, python_json_list(flags));
}

}  // namespace neffcache
