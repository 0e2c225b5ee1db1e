// Definitions of cache/lnl.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/lnl.hpp>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <ctime>
#include <utility>

#include <fmt/format.h>

#include <neffcache/core/detail/proc.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::string python_repr(std::string_view s) {
  const char q = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') out += {'\\', c};
    else if (c == '\t') out += "\\t";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out + q;
}

NEFFCACHE_DECL std::string python_repr(const std::vector<std::string>& list) {
  std::string out = "[";
  for (const auto& s : list) out += (out.size() > 1 ? ", " : "") + python_repr(s);
  return out + "]";
}

NEFFCACHE_DECL std::optional<LnlHolder> proc_holder(std::string_view pid) {
  auto c = process_command(pid);
  if (!c) return std::nullopt;
  return LnlHolder{.pid = 0, .process_name = std::move(c->comm), .cmdline = python_repr(c->argv)};
}

}  // namespace detail

NEFFCACHE_DECL std::string lnl_holder_record() {
  auto self = detail::proc_holder("self");
  if (!self) self = LnlHolder{};
  return fmt::format("pid:{}\nprocess_name:{}\ncmdline:{}\ntimestamp:{}\n", ::getpid(), self->process_name,
                     self->cmdline, static_cast<int64_t>(std::time(nullptr)));
}

NEFFCACHE_DECL std::optional<LnlHolder> parse_lnl_holder(std::string_view text) {
  LnlHolder h;
  bool pid = false;
  for (std::size_t at = 0; at < text.size();) {
    auto end = std::min(text.find('\n', at), text.size());
    auto line = text.substr(at, end - at);
    at = end + 1;
    auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    auto name = line.substr(0, colon), value = line.substr(colon + 1);
    if (name == "pid") {
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), h.pid);
      pid = ec == std::errc{} && p == value.data() + value.size() && h.pid > 0;
    } else if (name == "process_name") {
      h.process_name = value;
    } else if (name == "cmdline") {
      h.cmdline = value;
    }
  }
  return pid ? std::optional(h) : std::nullopt;
}

namespace detail {

NEFFCACHE_DECL bool lnl_take_option(const std::vector<std::string>& w, std::size_t& i, std::string_view name,
                                    std::string& value) {
  if (w[i] == name) {
    if (i + 1 >= w.size()) return false;
    value = w[++i];
    return true;
  }
  if (w[i].size() > name.size() && w[i].starts_with(name) && w[i][name.size()] == '=') {
    value = w[i].substr(name.size() + 1);
    return true;
  }
  return false;
}

}  // namespace detail

NEFFCACHE_DECL Result<LnlCommand> parse_compile_words(std::vector<std::string> w) {
  auto bad = [](std::string why) { return Error{Errc::invalid_argument, std::move(why)}; };
  auto sub = std::find(w.begin() + std::min<std::size_t>(w.size(), 1), w.end(), "compile");
  if (sub == w.end() || std::any_of(w.begin() + 1, sub, [](const std::string& o) {
        return !o.starts_with("--") || o.find('=') == std::string::npos;
      }))
    return bad("not a 'neuronx-cc compile ...' command");
  std::rotate(w.begin() + 1, sub, sub + 1);  // "compile" second, the options before it after it
  if (w.size() < 3) return bad("not a 'neuronx-cc compile ...' command");
  LnlCommand c;
  std::size_t input_at = w[2].starts_with('-') ? 0 : 2;
  bool may_be_value = false;  // the word before was an unknown option without "="
  for (std::size_t i = 2; i < w.size(); ++i) {
    if (i == input_at) continue;
    if (detail::lnl_take_option(w, i, "--framework", c.framework) ||
        detail::lnl_take_option(w, i, "--target", c.target) || detail::lnl_take_option(w, i, "--output", c.output) ||
        detail::lnl_take_option(w, i, "--logfile", c.logfile)) {
      may_be_value = false;
      continue;
    }
    if (w[i] == "--framework" || w[i] == "--target" || w[i] == "--output" || w[i] == "--logfile")
      return bad(fmt::format("{} without a value", w[i]));
    const bool option = w[i].starts_with('-');
    if (input_at == 0 && !option && (!may_be_value || w[i] == "graph.hlo" || w[i].ends_with("/graph.hlo"))) {
      input_at = i;
      continue;
    }
    may_be_value = option && w[i].find('=') == std::string::npos;
    c.flags.push_back(w[i]);
  }
  if (input_at == 0) return bad("no input HLO named");
  c.input = w[input_at];
  return c;
}

NEFFCACHE_DECL Result<LnlCommand> parse_lnl_command(std::string_view text) {
  auto words = shell_split(text);
  auto c = words ? parse_compile_words(*words) : Result<LnlCommand>(words.error());
  if (!c) return Error{Errc::invalid_argument, fmt::format("command.txt: {}", c.error().message)};
  return c;
}

NEFFCACHE_DECL std::vector<std::string> lnl_compile_argv(const std::string& program, const LnlCommand& c,
                                                         const std::string& hlo, const std::string& neff,
                                                         const std::string& log) {
  std::vector<std::string> argv{program, "compile", hlo, "--framework", c.framework};
  if (!c.target.empty()) argv.insert(argv.end(), {"--target", c.target});
  argv.insert(argv.end(), {"--output", neff, "--logfile", log});
  argv.insert(argv.end(), c.flags.begin(), c.flags.end());
  return argv;
}

NEFFCACHE_DECL std::vector<std::string> lnl_key_flags(const LnlCommand& c) {
  std::vector<std::string> out;
  if (!c.target.empty()) out.push_back("--target=" + c.target);
  for (std::size_t i = 0; i < c.flags.size(); ++i) {
    const auto& f = c.flags[i];
    if (f == "--verbose") {
      if (i + 1 < c.flags.size() && !c.flags[i + 1].starts_with('-')) ++i;
      continue;
    }
    if (f.starts_with("--verbose=")) continue;
    out.push_back(f);
  }
  return out;
}

NEFFCACHE_DECL Result<LnlCommand> read_lnl_command(const std::string& path) {
  auto text = detail::read_file(path);
  if (!text) return Error{Errc::io, fmt::format("cannot read {}", path)};
  auto c = parse_lnl_command(*text);
  if (!c) return Error{c.error().code, fmt::format("{}: {}", path, c.error().message)};
  return c;
}

NEFFCACHE_DECL Result<EntryCommand> entry_command(const std::string& entry_dir, const EntryFiles& files,
                                                  const std::vector<std::string>& default_flags) {
  std::optional<std::string> flags_file;
  if (files.has(EntryFile::flags)) flags_file = fmt::format("{}/{}", entry_dir, files.flags_name());
  if (files.is_lnl() && flags_file) {
    auto c = read_lnl_command(*flags_file);
    if (!c) return c.error();
    return EntryCommand{lnl_key_flags(*c), std::move(*c)};
  }
  auto flags = neuron_compiler_flags(flags_file, default_flags);
  if (!flags) return flags.error();
  return EntryCommand{std::move(*flags), std::nullopt};
}

NEFFCACHE_DECL std::string lnl_marker(double unix_time, uint64_t neff_bytes) {
  // {fmt} prints a double's shortest form that reads back the same, as Python's repr()
  // does; Python keeps ".0" on a whole number.
  std::string t = fmt::format("{}", unix_time);
  if (t.find_first_of(".en") == std::string::npos) t += ".0";
  return fmt::format("completed:{}\nneff_size:{}\n", t, neff_bytes);
}

NEFFCACHE_DECL double unix_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

NEFFCACHE_DECL std::optional<uint64_t> lnl_marker_neff_size(std::string_view text) {
  constexpr std::string_view field = "neff_size:";
  for (std::size_t at = 0; at < text.size();) {
    auto end = text.find('\n', at);
    auto line = text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    at = end == std::string_view::npos ? text.size() : end + 1;
    if (!line.starts_with(field)) continue;
    line.remove_prefix(field.size());
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
    if (ec != std::errc{} || p != line.data() + line.size() || line.empty()) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

}  // namespace neffcache
