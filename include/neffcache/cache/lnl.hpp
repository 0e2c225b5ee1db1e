// The compile command of an LNL entry (command.txt, see layout.hpp): what LNL ran,
//   neuronx-cc compile <graph.hlo> --framework XLA --target <t> --output <neff>
//     --logfile <log> <the entry's compiler arguments>
// read back so that another program (the daemon's compiler) can run the same compile
// in a work folder of its own, and so that the arguments can key the result. And the
// holder file of a key's lock (LnlHolder), which LNL's ranks read to tell a live
// compile from a dead one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// Who holds an LNL key's lock, as <root>/.<key>.compilation_metadata says it, in lines
//   pid:<n>
//   process_name:<the process's /proc/<pid>/comm>
//   cmdline:<its argv, as Python prints a list of strings>
//   [rank:<n>]
//   timestamp:<unix time>
// A rank that finds the lock taken (or before it locks) judges the holder by /proc of its
// own host: the pid gone, or its comm or command line different, is a dead holder.
struct LnlHolder {
  int64_t pid = 0;
  std::string process_name;
  std::string cmdline;
};

namespace detail {

// A string as Python's repr() prints it: in single quotes unless it holds a single quote
// and no double one; backslash, the quote, \t \n \r and other control bytes escaped.
// (Bytes of 0x80 and up are kept as they are: right for printable UTF-8, which is what
// command lines hold.)
NEFFCACHE_DECL std::string python_repr(std::string_view s);

// A list of strings as Python's repr() prints it: "['a', 'b']".
NEFFCACHE_DECL std::string python_repr(const std::vector<std::string>& list);

// `pid` ("self" for this process) as a holder file names it (process_command, without the
// pid); nullopt when it is gone.
NEFFCACHE_DECL std::optional<LnlHolder> proc_holder(std::string_view pid);

}  // namespace detail

// The holder file's text naming this process.
NEFFCACHE_DECL std::string lnl_holder_record();

// Parses a holder file; nullopt without a valid "pid:" line.
NEFFCACHE_DECL std::optional<LnlHolder> parse_lnl_holder(std::string_view text);

// Whether `h` names a live process of this host as a rank judges it: the pid exists with
// that comm and that command line.
inline bool lnl_holder_alive(const LnlHolder& h) {
  auto now = detail::proc_holder(std::to_string(h.pid));
  return now && now->process_name == h.process_name && now->cmdline == h.cmdline;
}

struct LnlCommand {
  std::string input;               // the HLO it compiles
  std::string framework = "XLA";   // --framework
  std::string target;              // --target; empty when not given
  std::vector<std::string> flags;  // everything else, in order, as written
  std::string output;              // --output; empty when not given
  std::string logfile;             // --logfile; empty when not given
};

namespace detail {
// The options whose values a compile of ours replaces (--output, --logfile) or keeps
// apart (--framework, --target), in both forms "--name value" and "--name=value".
NEFFCACHE_DECL bool lnl_take_option(const std::vector<std::string>& w, std::size_t& i, std::string_view name,
                                    std::string& value);
}  // namespace detail

// Parses the words of a compile command: the first is the compiler (any name or path),
// the second "compile" (or, in the wrapper's older order, options written "--name=value"
// come before it: they count as if written after it). The input is the word after "compile" when it is no option, else
// the first word that is no option and does not follow an option that may take a value
// (one of ours, or an unknown one without "="), else the first word naming a graph.hlo.
// Errors (Errc::invalid_argument) say what is missing.
NEFFCACHE_DECL Result<LnlCommand> parse_compile_words(std::vector<std::string> w);

// Parses command.txt, a shell-quoted compile command (parse_compile_words). Errors
// (Errc::invalid_argument) begin "command.txt: ".
NEFFCACHE_DECL Result<LnlCommand> parse_lnl_command(std::string_view text);

// The command line that compiles `c` with `program` into a work folder: the HLO, the
// NEFF and the log at the given paths, the framework, target and flags as the entry has
// them.
NEFFCACHE_DECL std::vector<std::string> lnl_compile_argv(const std::string& program, const LnlCommand& c,
                                                         const std::string& hlo, const std::string& neff,
                                                         const std::string& log);

// The flags that key an LNL entry's result: the target first ("--target=<t>"), then the
// compiler arguments without --verbose (which changes only what is printed). Paths
// (input, output, log) never count.
NEFFCACHE_DECL std::vector<std::string> lnl_key_flags(const LnlCommand& c);

// Reads and parses the command.txt at `path`. Errors: Errc::io when it cannot be read
// (which may pass), Errc::invalid_argument when its content is bad (the entry's fault).
NEFFCACHE_DECL Result<LnlCommand> read_lnl_command(const std::string& path);

// What compiles the entry folder `entry_dir`, whose files are `files` (rather than a look:
// the callers have just listed the folder), in either dialect: its compiler flags (of a
// Neuron entry, neuron_compiler_flags (flags.hpp: its compile_flags.json, else
// `default_flags`); of an LNL entry, lnl_key_flags of its command.txt, or `default_flags`
// when it has only LNL's metadata) and, of an LNL entry with command.txt, that command.
// The one rule for the compile, the job's dedup key, the content identity and `explain`.
struct EntryCommand {
  std::vector<std::string> flags;
  std::optional<LnlCommand> lnl;
};
NEFFCACHE_DECL Result<EntryCommand> entry_command(const std::string& entry_dir, const EntryFiles& files,
                                                  const std::vector<std::string>& default_flags);
// entry_command's flags.
inline Result<std::vector<std::string>> entry_compiler_flags(const std::string& entry_dir, const EntryFiles& files,
                                                             const std::vector<std::string>& default_flags) {
  auto c = entry_command(entry_dir, files, default_flags);
  if (!c) return c.error();
  return std::move(c->flags);
}

// The content of LNL's completion marker: "completed:<unix time>\nneff_size:<bytes>\n",
// the time as Python prints time.time() (a float: "1764340000.123456", "1764340000.0").
NEFFCACHE_DECL std::string lnl_marker(double unix_time, uint64_t neff_bytes);

// Now, as Python's time.time() gives it.
NEFFCACHE_DECL double unix_time_now();

// The NEFF size a marker's text records (its "neff_size:" line); nullopt when it records
// none (an empty or older marker), which is no error: the marker's presence is the hit.
NEFFCACHE_DECL std::optional<uint64_t> lnl_marker_neff_size(std::string_view text);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/lnl.ipp>
#endif
