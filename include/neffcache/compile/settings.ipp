// Definitions of compile/settings.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/settings.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <mutex>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL std::optional<std::string> resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos)
    return ::access(program.c_str(), X_OK) == 0 ? std::optional<std::string>(program) : std::nullopt;
  const char* path = std::getenv("PATH");
  for (std::string_view rest = path ? path : ""; !rest.empty();) {
    auto dir = rest.substr(0, rest.find(':'));
    if (std::string file = fmt::format("{}/{}", dir, program); !dir.empty() && ::access(file.c_str(), X_OK) == 0)
      return file;
    rest.remove_prefix(std::min(rest.size(), dir.size() + 1));
  }
  return std::nullopt;
}

NEFFCACHE_DECL std::optional<std::string> compiler_version_of(const std::string& program,
                                                              const std::optional<RunAs>& run_as) {
  constexpr auto k_retry_failure = std::chrono::minutes(1);
  struct Known {
    ino_t ino = 0;
    off_t size = 0;
    int64_t ctime_ns = 0;
    std::optional<std::string> version;
    std::chrono::steady_clock::time_point asked{};
    bool same_file(const Known& o) const { return ino == o.ino && size == o.size && ctime_ns == o.ctime_ns; }
  };
  static std::mutex mu;  // guards known; a leaf
  static std::map<std::string, Known, std::less<>> known;
  auto file = resolve_program(program);
  struct stat st {};
  if (!file || ::stat(file->c_str(), &st) != 0) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  Known k{st.st_ino, st.st_size, static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec, {}, now};
  const std::string asker = run_as ? fmt::format("{}\n{}", *file, run_as->uid) : *file;
  {
    std::lock_guard lock(mu);
    if (auto it = known.find(asker);
        it != known.end() && it->second.same_file(k) &&
        (it->second.version || now - it->second.asked < k_retry_failure))
      return it->second.version;
  }
  std::vector<std::string> argv{*file, "--version"};
  if (run_as) argv = run_as->command(std::move(argv));
  if (auto run = detail::run_capture(argv, k_version_query_timeout); run && run->exit_code == 0)
    if (auto at = run->output.find("Compiler version"); at != std::string::npos)
      if (auto v = parse_compiler_version(std::string_view(run->output).substr(at))) k.version = std::move(*v);
  std::lock_guard lock(mu);
  known.insert_or_assign(asker, k);
  return k.version;
}

NEFFCACHE_DECL Result<CompilerTemplate> CompilerTemplate::parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Error{Errc::invalid_argument, fmt::format("bad compiler template '{}': {}", text, why)};
  };
  auto words = shell_split(text);
  if (!words) return bad(words.error().message);
  if (words->empty()) return bad("empty");
  bool hlo = false, neff = false;
  for (const auto& w : *words) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (w[i] == '}') return bad("'}' without '{'");
      if (w[i] != '{') continue;
      auto end = w.find('}', i);
      if (end == std::string::npos) return bad("'{' without '}'");
      std::string_view name(w.data() + i + 1, end - i - 1);
      if (name == "flags" && w != "{flags}") return bad("{flags} must be a word of its own");
      if (name != "hlo" && name != "neff" && name != "flags" && name != "workdir" && name != "key")
        return bad(fmt::format("unknown placeholder {{{}}} (known: hlo neff flags workdir key)", name));
      hlo |= name == "hlo";
      neff |= name == "neff";
      i = end;
    }
  }
  if (!hlo || !neff) return bad("it needs both {hlo} and {neff}");
  return CompilerTemplate(std::move(*words), std::string(text));
}

NEFFCACHE_DECL std::vector<std::string> CompilerTemplate::expand(const Values& v) const {
  std::vector<std::string> out;
  for (const auto& w : words_) {
    if (w == "{flags}") {
      out.insert(out.end(), v.flags.begin(), v.flags.end());
      continue;
    }
    std::string s;
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (w[i] != '{') {
        s += w[i];
        continue;
      }
      auto end = w.find('}', i);
      std::string_view name(w.data() + i + 1, end - i - 1);
      s += name == "hlo" ? v.hlo : name == "neff" ? v.neff : name == "workdir" ? v.workdir : v.key;
      i = end;
    }
    out.push_back(std::move(s));
  }
  return out;
}

NEFFCACHE_DECL bool compiler_dir_serves(std::string_view entry_path, std::string_view compiler_dir) {
  const std::string dir = compiler_dir_of(entry_path);
  return dir.empty() || dir == compiler_dir;
}

NEFFCACHE_DECL Result<void> compiler_serves(std::string_view entry_path, const std::optional<std::string>& version,
                                            std::string_view program) {
  if (compiler_dir_serves(entry_path, version ? compiler_dir_name(*version) : std::string())) return {};
  const std::string dir = compiler_dir_of(entry_path);
  std::string_view wanted =
      std::string_view(dir).substr(dir.starts_with(k_compiler_dir_prefix) ? k_compiler_dir_prefix.size() : 0);
  return Error{Errc::invalid_argument,
               version ? fmt::format("{}: not compiled: its folder is for compiler {}, and '{}' reports {}", entry_path,
                                     wanted, program, *version)
                       : fmt::format("{}: not compiled: its folder is for compiler {}, and '{}' reports no version "
                                     "('{} --version')",
                                     entry_path, wanted, program, program)};
}

NEFFCACHE_DECL Result<CompilerTemplate> compiler_option(std::string_view text, Installed check) {
  auto tmpl = CompilerTemplate::parse(text.empty() ? k_default_compiler_template : text);
  if (!tmpl) return tmpl.error();
  if (check == Installed::required && !tmpl->installed())
    return Error{Errc::not_found, fmt::format("compiler '{}' not found on PATH", tmpl->program())};
  return tmpl;
}

NEFFCACHE_DECL Result<int> max_retries_from_env(const std::function<std::optional<std::string>(const char*)>& env) {
  auto v = env("NEURON_PARALLEL_COMPILE_MAX_RETRIES");
  if (!v || v->empty()) return 0;
  int n = 0;
  bool ok = v->size() <= 3;
  for (char c : *v) ok = ok && c >= '0' && c <= '9', n = n * 10 + (c - '0');
  if (!ok || n > 100)
    return Error{Errc::invalid_argument,
                 fmt::format("NEURON_PARALLEL_COMPILE_MAX_RETRIES='{}' is not a number from 0 to 100", *v)};
  return n;
}

}  // namespace neffcache
