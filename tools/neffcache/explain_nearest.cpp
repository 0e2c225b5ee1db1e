// The nearest cached graphs of `neffcache explain` (explain_nearest.hpp).
#include "neffcache/explain_nearest.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/core/detail/fs.hpp>

namespace neffcache::cli {
namespace {

// The words of `a` that `b` lacks, in a's order, each as often as it is missing.
std::vector<std::string> missing_from(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::multiset<std::string_view> rest(b.begin(), b.end());
  std::vector<std::string> out;
  for (const auto& w : a) {
    if (auto it = rest.find(w); it != rest.end()) rest.erase(it);
    else out.push_back(w);
  }
  return out;
}

// An entry of the same graph: what differs is its compiler folder, or its flags, or
// nothing (an equal entry the content index does not know).
Nearest same_graph(const std::string& entry, bool failed, const std::vector<std::string>& flags,
                   const AskedGraph& asked) {
  Nearest n;
  n.entry = entry;
  n.failed = failed;
  n.compiler_dir = entry.substr(0, entry.find('/'));
  n.flags_added = missing_from(asked.flags, flags);
  n.flags_removed = missing_from(flags, asked.flags);
  if (n.compiler_dir != asked.id.compiler_dir) n.differs = Nearest::Differs::compiler;
  else if (flags_hash(flags) != asked.id.flags_hash) n.differs = Nearest::Differs::flags;
  else n.differs = Nearest::Differs::nothing;
  return n;
}

// A done or failed entry the scan may read.
struct Candidate {
  std::string entry;
  std::string hlo_name;
  EntryFiles files;
  double similarity = 0;  // smaller HLO size / larger one; 1 for the same graph hash in its name
};

}  // namespace

std::vector<Nearest> nearest_entries(const ContentIndex& index, const AskedGraph& asked, const std::string& except,
                                     const std::vector<std::string>& default_flags) {
  std::vector<Nearest> found;
  std::set<std::string, std::less<>> seen{except};
  // The identities of the same graph already reported (compiler folder + flags hash):
  // another entry of one of them would say the same again.
  std::set<std::string, std::less<>> same_ids;
  auto dir_of = [&](const std::string& entry) { return index.entry_dir(entry); };

  // The index's records of the same graph under other flags or compilers.
  for (const auto& id : index.ids_of_graph(asked.id.graph_sha256)) {
    if (id == asked.id) continue;  // its records failed their check already
    for (const auto& r : index.records(id)) {
      if (seen.contains(r.entry) || !index.check(r)) continue;
      // (An entry whose flags cannot be read is left out of the comparison.)
      auto files = read_entry_files(dir_of(r.entry));
      if (!files) continue;
      auto flags = entry_compiler_flags(dir_of(r.entry), *files, default_flags);
      if (!flags) continue;
      seen.insert(r.entry);
      same_ids.insert(fmt::format("{}+{}", id.compiler_dir, id.flags_hash));
      found.push_back(same_graph(r.entry, r.failed, *flags, asked));
      break;  // one entry per identity says what differs
    }
  }

  // Entries the index may not know: those named after the same graph hash (any compiler
  // folder), then those of the same compiler folder with the closest HLO sizes.
  const std::string name_prefix = fmt::format("{}{}", k_module_dir_prefix,
                                              asked.id.graph_sha256.substr(0, k_graph_hash_digits));
  std::vector<Candidate> named, sized;
  (void)for_each_entry(index.layers(), [&](const LayerEntryRef& at) {
    const EntryRef& ref = at.ref;
    if ((!ref.files.done() && !ref.files.failed()) || !ref.files.has_hlo()) return;
    std::string entry = ref.relative_path();
    if (seen.contains(entry)) return;
    Candidate c{entry, std::string(*ref.files.hlo_name()), ref.files, 1.0};
    if (ref.module_dir.starts_with(name_prefix)) {
      named.push_back(std::move(c));
      return;
    }
    struct stat st {};
    if (ref.compiler_dir != asked.id.compiler_dir || ::fstatat(ref.dir_fd, c.hlo_name.c_str(), &st, 0) != 0) return;
    auto size = static_cast<double>(st.st_size), ours = static_cast<double>(asked.hlo_bytes);
    c.similarity = std::max(size, ours) > 0 ? std::min(size, ours) / std::max(size, ours) : 1.0;
    sized.push_back(std::move(c));
  });
  std::sort(sized.begin(), sized.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(b.similarity, a.entry) < std::tie(a.similarity, b.entry);
  });
  if (named.size() > k_explain_max_reads) named.resize(k_explain_max_reads);
  if (sized.size() > k_explain_max_reads) sized.resize(k_explain_max_reads);
  named.insert(named.end(), std::make_move_iterator(sized.begin()), std::make_move_iterator(sized.end()));

  for (const auto& c : named) {
    const std::string dir = dir_of(c.entry);
    auto bytes = detail::read_file(fmt::format("{}/{}", dir, c.hlo_name));
    if (!bytes) continue;
    auto graph = split_hlo(*bytes);
    if (!graph) continue;
    if (graph->analysis.canonical_sha256 == asked.id.graph_sha256) {
      auto flags = entry_compiler_flags(dir, c.files, default_flags);
      if (flags && same_ids
                       .insert(fmt::format("{}+{}", c.entry.substr(0, c.entry.find('/')),
                                           flags_hash(*flags)))
                       .second)
        found.push_back(same_graph(c.entry, c.files.failed(), *flags, asked));
      continue;
    }
    if (!c.entry.starts_with(asked.id.compiler_dir + "/")) continue;  // another graph and compiler: not near
    Nearest n;
    n.entry = c.entry;
    n.failed = c.files.failed();
    n.compiler_dir = asked.id.compiler_dir;
    n.diff = diff_hlo_units(graph->units, asked.units);
    found.push_back(std::move(n));
  }

  // Equal graphs first (nothing, flags, compiler), then the fewest differing units.
  auto rank = [](const Nearest& n) {
    return std::make_tuple(static_cast<int>(n.differs), n.diff.of_instructions ? 1 : 0,
                           n.diff.added + n.diff.removed + n.diff.changed, std::string_view(n.entry));
  };
  std::sort(found.begin(), found.end(), [&](const Nearest& a, const Nearest& b) { return rank(a) < rank(b); });
  if (found.size() > k_explain_nearest) found.resize(k_explain_nearest);
  return found;
}

}  // namespace neffcache::cli
