// Definitions of cache/flags.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/flags.hpp>

#include <array>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

NEFFCACHE_DECL Result<std::vector<std::string>> shell_split(std::string_view line) {
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

NEFFCACHE_DECL Result<ParsedFlags> separate_wrapper_options(const std::vector<std::string>& words) {
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

namespace detail {

NEFFCACHE_DECL int32_t decode_utf8(std::string_view s, std::size_t& i) {
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

NEFFCACHE_DECL void append_json_escape(std::string& out, uint32_t unit) {
  fmt::format_to(std::back_inserter(out), "\\u{:04x}", unit);
}

}  // namespace detail

NEFFCACHE_DECL std::string python_json_string(std::string_view s) {
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

NEFFCACHE_DECL std::string python_json_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += python_json_string(items[i]);
  }
  out += ']';
  return out;
}

NEFFCACHE_DECL std::string flags_hash(const std::vector<std::string>& flags,
                                      FlagsHashForm form) {
  std::string text;
  if (form == FlagsHashForm::json) {
    text = python_json_list(flags);
  } else {
    for (std::size_t i = 0; i < flags.size(); ++i) (i ? text += ' ' : text) += flags[i];
  }
  return detail::md5_hex(text).substr(0, k_flags_hash_digits);
}

NEFFCACHE_DECL Result<std::vector<std::string>> parse_compile_flags(std::string_view text) {
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

NEFFCACHE_DECL Result<std::vector<std::string>> read_compile_flags(const std::string& path) {
  auto text = detail::read_file(path);
  if (!text) return text.error();
  auto flags = parse_compile_flags(*text);
  if (!flags) return Error{flags.error().code, fmt::format("{}: {}", path, flags.error().message)};
  return flags;
}

NEFFCACHE_DECL Result<std::vector<std::string>> neuron_compiler_flags(const std::optional<std::string>& flags_file,
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

}  // namespace neffcache
