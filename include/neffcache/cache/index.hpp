// The content index: which entries of a cache hold a result (a NEFF, or a deterministic
// failure) of a content identity, so that an entry whose graph was compiled before under
// another name gets that result instead of a compile.
//
// A content identity is what decides a compile's result: the compiler folder, the full
// SHA-256 of the canonical graph (hlo.hpp) and the hash of the effective compiler flags
// (wrapper options removed). Two entries with equal identities differ only in what the
// compiler ignores (names, debug metadata, where the client ran).
//
// Both dialects share one index. An LNL entry has no compiler folder: its identity names
// the version of the compiler that compiles it here (pending) or that compiled it (our
// publication record's compiler_version), as neuronxcc-<version>, and its flags are its
// target as --target=<t> then its arguments (lnl_key_flags). So an LNL entry and a
// Neuron entry are twins when the compiler versions are equal, the canonical graphs are
// equal and the Neuron entry's compile_flags.json lists the same words. An LNL entry that
// its client compiled records no compiler version: it has no identity, and serves none.
//
// On disk, under the cache's root (a mount's backing folder), inside the private folder
// that a mount shows as its statistics folder, so no client of the mount sees it:
//   .neffcache/index/by-id/neuronxcc-<v>/<sha256>+<flags hash>/MODULE_<...>   a record
//   .neffcache/index/by-id/neuronxcc-<v>/<sha256>+<flags hash>/<LNL key>      a record
//   .neffcache/index/by-entry/neuronxcc-<v>/MODULE_<...>                      its identity
//   .neffcache/index/by-entry/<LNL key>                                       its identity
// One file per (identity, entry), each replaced whole by a rename, so publishers never
// contend and a reader sees a whole record or none. Every write is best effort: a full
// disk or a read-only folder costs twins, never a publish.
//
// A record is a hint, never trusted: before use, the entry it names must still hold the
// recorded result, and a NEFF must have the recorded size and checksum (the checksum is
// taken again unless the file is the very one hashed: same inode, size and mtime).
// Records that fail are dropped (and logged once, by whoever dropped them). Records not
// written by this user or root are ignored, so no other user can point an identity at
// a NEFF of their choosing.
//
// Over layers (layers.hpp), records are written in layer 0 only and name entries as the
// layers show them, each found in the layer that holds it; a lower layer's own index
// (a cache shipped with one) is read too, never changed.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/layers.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/hlo/hlo.hpp>

namespace neffcache {

inline constexpr std::string_view k_index_dir = ".neffcache/index";

// A content identity, written neuronxcc-<v>/<sha256 of the canonical graph>+<flags hash>
// (the scheduler's dedup key for an entry folder).
struct ContentId {
  std::string compiler_dir;  // neuronxcc-<version>
  std::string graph_sha256;  // 64 hex digits
  std::string flags_hash;    // 8 hex digits

  std::string str() const { return fmt::format("{}/{}+{}", compiler_dir, graph_sha256, flags_hash); }
  bool operator==(const ContentId&) const = default;

  // The identity written as str(); nullopt for anything else (so a string read from a
  // file never becomes a path outside the index).
  static std::optional<ContentId> parse(std::string_view s) {
    auto hex = [](std::string_view h, std::size_t n) {
      return h.size() == n && h.find_first_not_of("0123456789abcdef") == std::string_view::npos;
    };
    // (A compiler version may hold '+' itself: 2.15.128.0+56dc5a86.)
    auto slash = s.find('/'), plus = s.rfind('+');
    if (slash == std::string_view::npos || plus == std::string_view::npos || plus < slash) return std::nullopt;
    ContentId id{std::string(s.substr(0, slash)), std::string(s.substr(slash + 1, plus - slash - 1)),
                 std::string(s.substr(plus + 1))};
    if (!id.compiler_dir.starts_with(k_compiler_dir_prefix) ||
        !check_compiler_version(std::string_view(id.compiler_dir).substr(k_compiler_dir_prefix.size())) ||
        !hex(id.graph_sha256, 64) || !hex(id.flags_hash, k_flags_hash_digits))
      return std::nullopt;
    return id;
  }
};

namespace detail {

inline int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// The compiler version our publication record of `entry_dir` names (compiler_version,
// written when we compile or serve an LNL entry), when the record describes the NEFF
// there now: the recorded size, and no NEFF newer than the record (a client that
// compiled the entry again left our record behind). nullopt otherwise, or when it names
// no version.
inline std::optional<std::string> recorded_compiler_version(const std::string& entry_dir) {
  const std::string meta_path = fmt::format("{}/{}", entry_dir, k_meta_file);
  const std::string neff_path = fmt::format("{}/{}", entry_dir, EntryFiles::of_entry_path(entry_dir).neff_name());
  struct stat meta_st {}, neff_st {};
  if (::stat(meta_path.c_str(), &meta_st) != 0 || ::stat(neff_path.c_str(), &neff_st) != 0) return std::nullopt;
  auto text = read_file(meta_path);
  if (!text) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("compiler_version") || !j["compiler_version"].is_string() ||
      !j.contains("size") || j["size"] != neff_st.st_size || mtime_ns(meta_st) < mtime_ns(neff_st))
    return std::nullopt;
  auto v = j["compiler_version"].get<std::string>();
  if (!check_compiler_version(v)) return std::nullopt;
  return v;
}

}  // namespace detail

// The compiler folder of an LNL entry's identity (see the top): the version its result
// came from (our record), else, for an entry still to be compiled, `compiler_version`,
// the version of the compiler that compiles it here (empty: unknown). nullopt: no
// identity.
inline std::optional<std::string> lnl_identity_compiler_dir(const std::string& entry_dir, const EntryFiles& files,
                                                            std::string_view compiler_version) {
  std::optional<std::string> v;
  if (files.done() || files.failed()) v = detail::recorded_compiler_version(entry_dir);
  else if (!compiler_version.empty() && check_compiler_version(compiler_version)) v = std::string(compiler_version);
  if (!v) return std::nullopt;
  return compiler_dir_name(*v);
}

// The identity of the entry folder `entry_dir` (…/neuronxcc-<v>/MODULE_<…>, or an LNL
// entry <root>/<key>, whose compiler folder is lnl_identity_compiler_dir's with
// `compiler_version`): its HLO, read and hashed, and its flags (compile_flags.json, else
// `default_flags`; an LNL entry's command.txt). Errors: no HLO, an unreadable one, bad
// flags, an LNL entry without a known compiler version.
inline Result<ContentId> entry_content_id(const std::string& entry_dir,
                                          const std::vector<std::string>& default_flags = {},
                                          std::string_view compiler_version = {}) {
  auto files = read_entry_files(entry_dir);
  if (!files) return files.error();
  std::string compiler_dir;
  if (files->is_lnl()) {
    auto dir = lnl_identity_compiler_dir(entry_dir, *files, compiler_version);
    if (!dir)
      return Error{Errc::invalid_argument,
                   fmt::format("{}: an LNL entry with no known compiler version has no content identity", entry_dir)};
    compiler_dir = std::move(*dir);
  } else {
    compiler_dir = compiler_dir_of(entry_dir);
  }
  if (!files->has_hlo()) return Error{Errc::not_found, fmt::format("{}: no HLO file", entry_dir)};
  auto hlo = analyze_hlo_file(fmt::format("{}/{}", entry_dir, *files->hlo_name()));
  if (!hlo) return hlo.error();
  auto flags = entry_compiler_flags(entry_dir, *files, default_flags);
  if (!flags) return flags.error();
  return ContentId{std::move(compiler_dir), hlo->canonical_sha256, flags_hash(*flags)};
}

// What one entry holds of an identity.
struct IndexRecord {
  std::string entry;  // neuronxcc-<v>/MODULE_<…> or an LNL key, relative to the cache root
  bool failed = false;  // a recorded deterministic failure (model.log), not a NEFF
  uint64_t size = 0;    // the NEFF's bytes
  std::string xxh3;     // its checksum, 16 hex digits
  double compile_seconds = 0;  // what compiling it took (what a twin saves)
  // The NEFF's inode and mtime when the checksum was taken.
  uint64_t ino = 0;
  int64_t mtime_ns = 0;

  nlohmann::ordered_json to_json() const {
    return {{"entry", entry}, {"result", failed ? "failure" : "neff"}, {"size", size}, {"xxh3", xxh3},
            {"compile_seconds", compile_seconds}, {"ino", ino}, {"mtime_ns", mtime_ns}};
  }
  static std::optional<IndexRecord> from_json(std::string_view text) {
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::nullopt;
    IndexRecord r;
    auto str = [&](const char* k, std::string& out) {
      return j.contains(k) && j[k].is_string() ? (out = j[k].get<std::string>(), true) : false;
    };
    auto uint = [&](const char* k, auto& out) {
      if (!j.contains(k) || !j[k].is_number_integer() || j[k].get<int64_t>() < 0) return false;
      out = j[k].get<std::remove_reference_t<decltype(out)>>();
      return true;
    };
    std::string result;
    if (!str("entry", r.entry) || !str("result", result) || (result != "neff" && result != "failure")) return std::nullopt;
    r.failed = result == "failure";
    if (!r.failed && (!uint("size", r.size) || !str("xxh3", r.xxh3) || r.xxh3.size() != 16 || !uint("ino", r.ino) ||
                      !uint("mtime_ns", r.mtime_ns)))
      return std::nullopt;
    if (j.contains("compile_seconds") && j["compile_seconds"].is_number())
      r.compile_seconds = std::max(0.0, j["compile_seconds"].get<double>());
    return r;
  }
};

// A record checked against its entry: for a NEFF, `neff` is the verified file, open, so
// that what is linked or copied is the very file checked; `dir` is the entry's folder
// (in the layer that holds it).
struct Twin {
  IndexRecord record;
  detail::UniqueFd neff;
  std::string dir;
};

namespace detail {

// An entry's publication record (.neffcache-meta.json, compile/publish.hpp) as a JSON
// object: an empty one when it is missing or is no JSON object.
inline nlohmann::json read_entry_meta(const std::string& entry_dir) {
  auto text = read_file(fmt::format("{}/{}", entry_dir, k_meta_file));
  auto j = text ? nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
  return j.is_object() ? j : nlohmann::json::object();
}

// The checksum (16 hex digits) of the model.neff of `entry_dir`, open as `fd`, with `st`
// its fstat: the one its publication record `meta` (read_entry_meta) gives when the
// record describes this very file, else taken from `fd` (its offset is left alone).
// The record is trusted only for the file it was written with: a NEFF published and not
// changed since has the recorded size and an mtime no later than the record's. Errors:
// a read of `fd` fails.
inline Result<std::string> neff_xxh3(const std::string& entry_dir, int fd, const struct stat& st,
                                     const nlohmann::json& meta) {
  struct stat mst {};
  const std::string meta_path = fmt::format("{}/{}", entry_dir, k_meta_file);
  if (meta.contains("xxh3") && meta["xxh3"].is_string() && meta.contains("size") && meta["size"] == st.st_size &&
      ::stat(meta_path.c_str(), &mst) == 0 && mtime_ns(mst) >= mtime_ns(st))
    return meta["xxh3"].get<std::string>();
  auto h = fd_xxh3(fd, entry_dir);
  if (!h) return h.error();
  return xxh3_hex(*h);
}

// Creates `dir` and its parents as needed (mode 0755 less the umask).
inline Result<void> make_dirs(const std::string& dir) {
  for (std::size_t at = 1; at <= dir.size(); ++at) {
    if (at != dir.size() && dir[at] != '/') continue;
    std::string part = dir.substr(0, at);
    if (sys::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return sys_error("create", part);
  }
  return {};
}

}  // namespace detail

class ContentIndex {
 public:
  // The index of the cache at `root` (a mount's backing folder, not the mount), with
  // `lowers` the read-only layers under it (layers.hpp), if any.
  explicit ContentIndex(std::string root, std::vector<std::string> lowers = {})
      : root_(root), layers_(std::move(root), std::move(lowers)) {}
  const std::string& root() const { return root_; }
  const Layers& layers() const { return layers_; }
  std::string dir() const { return fmt::format("{}/{}", root_, k_index_dir); }
  // The folder of `entry` (an entry path) in the layer that shows it.
  std::string entry_dir(std::string_view entry) const { return layers_.path(entry); }

  // Records that `entry` (neuronxcc-*/MODULE_*, or an LNL key) holds a result of `id`, as it holds it now:
  // a done NEFF (size and checksum: from the publication record when it describes this
  // very file, else hashed) or a recorded failure. `compile_seconds`: what the result
  // took to compile, when the caller knows better than the publication record.
  Result<IndexRecord> add(const ContentId& id, const std::string& entry,
                          std::optional<double> compile_seconds = std::nullopt) const {
    const std::string entry_dir = this->entry_dir(entry);
    auto files = read_entry_files(entry_dir);
    if (!files) return files.error();
    IndexRecord r;
    r.entry = entry;
    auto meta = detail::read_entry_meta(entry_dir);
    if (meta.contains("compile_seconds") && meta["compile_seconds"].is_number())
      r.compile_seconds = meta["compile_seconds"].get<double>();
    if (meta.contains("compile_seconds_saved") && meta["compile_seconds_saved"].is_number())
      r.compile_seconds = meta["compile_seconds_saved"].get<double>();
    if (compile_seconds) r.compile_seconds = *compile_seconds;
    if (files->done()) {
      struct stat st {};
      auto fd = detail::open_regular(fmt::format("{}/{}", entry_dir, files->neff_name()), &st);
      if (!fd) return fd.error();
      r.size = static_cast<uint64_t>(st.st_size);
      r.ino = static_cast<uint64_t>(st.st_ino);
      r.mtime_ns = detail::mtime_ns(st);
      auto h = detail::neff_xxh3(entry_dir, fd->get(), st, meta);
      if (!h) return h.error();
      r.xxh3 = std::move(*h);
    } else if (files->failed()) {
      r.failed = true;
    } else {
      return Error{Errc::invalid_argument, fmt::format("{}: neither done nor failed", entry_dir)};
    }
    if (auto w = write(record_path(id, entry), r.to_json().dump() + "\n"); !w) return w.error();
    if (auto w = write(entry_path(entry), id.str() + "\n"); !w) return w.error();
    // A removal that came meanwhile (the entry was done, so a client may act on it before
    // we record it) saw no record to forget: look again, and forget it ourselves.
    if (auto now = read_entry_files(entry_dir); !now || !(r.failed ? now->failed() : now->done())) {
      forget(id, entry);
      return Error{Errc::not_found, fmt::format("{}: changed while it was recorded", entry_dir)};
    }
    return r;
  }

  // The records of `id`, as written (unchecked; unreadable ones left out): layer 0's,
  // then those of the lower layers' own indexes for entries not recorded above them.
  std::vector<IndexRecord> records(const ContentId& id) const {
    std::vector<IndexRecord> out;
    std::set<std::string, std::less<>> seen;
    for (const auto& root : layers_.roots()) {
      const std::string dir = id_dir(root, id);
      int fd = detail::open_dir_at(AT_FDCWD, dir.c_str());
      if (fd < 0) continue;
      (void)detail::list_dir(fd, dir, [&](std::string_view name, bool) {
        if (!is_entry_folder(name)) return;
        auto r = read_record(fmt::format("{}/{}", dir, name));
        if (r && r->entry == entry_of(id, name) && seen.insert(r->entry).second) out.push_back(std::move(*r));
      });
    }
    return out;
  }

  // A twin of `id` other than the entry `except`: the first record whose entry still holds
  // what it records (failures only when `with_failures`). Records that fail the check are
  // dropped, each reported once through `log`.
  std::optional<Twin> find(const ContentId& id, std::string_view except, bool with_failures,
                           const std::function<void(std::string_view)>& log = {}) const {
    for (auto& r : records(id)) {
      if (r.entry == except || (r.failed && !with_failures)) continue;
      auto twin = check(r);
      if (twin) return std::move(*twin);
      forget(id, r.entry);
      if (log) log(fmt::format("content index: dropped {} for {}: {}", r.entry, id.str(), twin.error().message));
    }
    return std::nullopt;
  }

  // Every identity with records of the graph `graph_sha256`, under any compiler folder
  // and flags hash (the same graph compiled otherwise: what `neffcache explain` compares
  // a miss with). Unreadable folders are left out; no order.
  std::vector<ContentId> ids_of_graph(std::string_view graph_sha256) const {
    std::vector<ContentId> out;
    for (const auto& root : layers_.roots()) {
      const std::string by_id = fmt::format("{}/{}/by-id", root, k_index_dir);
      int fd = detail::open_dir_at(AT_FDCWD, by_id.c_str());
      if (fd >= 0) ids_of_graph_in(fd, by_id, graph_sha256, out);
    }
    return out;
  }

  // The identity recorded for `entry`, if any.
  std::optional<ContentId> id_of(const std::string& entry) const {
    auto text = detail::read_file(entry_path(entry));
    if (!text) return std::nullopt;
    std::string_view t = *text;
    while (!t.empty() && t.back() == '\n') t.remove_suffix(1);
    return ContentId::parse(t);
  }

  // Removes the record of `entry` under `id` (and its identity, if it is that one).
  // Folders left empty go too, up to the private folder, so that a cache whose entries
  // are all removed is an empty folder again.
  void forget(const ContentId& id, const std::string& entry) const {
    sys::unlink(record_path(id, entry).c_str());
    if (auto mine = id_of(entry); mine && *mine == id) sys::unlink(entry_path(entry).c_str());
    for (const auto& d : {id_dir(id), fmt::format("{}/by-id/{}", dir(), id.compiler_dir), fmt::format("{}/by-id", dir()),
                          fmt::format("{}/by-entry/{}", dir(), id.compiler_dir), fmt::format("{}/by-entry", dir()), dir(),
                          fmt::format("{}/{}", root_, k_private_prefix)})
      ::rmdir(d.c_str());
  }
  // Removes whatever is recorded for `entry`.
  void forget(const std::string& entry) const {
    if (auto id = id_of(entry)) forget(*id, entry);
  }

  // Whether `entry` has an identity recorded (a stat: cheap enough for every hit).
  bool knows(const std::string& entry) const { return ::access(entry_path(entry).c_str(), F_OK) == 0; }

  // Checks a record against its entry now (see the header). Errors say why it fails.
  Result<Twin> check(const IndexRecord& r) const {
    if (!is_entry_path(r.entry)) return Error{Errc::invalid_argument, fmt::format("{}: not an entry path", r.entry)};
    const std::string entry_dir = this->entry_dir(r.entry);
    auto files = read_entry_files(entry_dir);
    if (!files) return files.error();
    if (r.failed) {
      if (!files->failed()) return Error{Errc::not_found, "its failure is no longer recorded"};
      return Twin{r, {}, entry_dir};
    }
    if (!files->done()) return Error{Errc::not_found, "it is no longer done"};
    const std::string name = files->neff_name();
    const std::string neff = fmt::format("{}/{}", entry_dir, name);
    struct stat st {};
    auto fd = detail::open_regular(neff, &st);
    if (!fd) return fd.error();
    if (static_cast<uint64_t>(st.st_size) != r.size)
      return Error{Errc::invalid_argument, fmt::format("{} has {} bytes, {} were recorded", name, st.st_size, r.size)};
    if (static_cast<uint64_t>(st.st_ino) != r.ino || detail::mtime_ns(st) != r.mtime_ns) {
      auto h = detail::fd_xxh3(fd->get(), neff);
      if (!h) return h.error();
      if (const std::string hex = detail::xxh3_hex(*h); hex != r.xxh3)
        return Error{Errc::invalid_argument, fmt::format("{} has checksum {}, {} was recorded", name, hex, r.xxh3)};
    }
    return Twin{r, std::move(*fd), entry_dir};
  }

 private:
  // Adds the identities of `graph_sha256` in the by-id folder open as `fd` (taken) to
  // `out`, once each.
  static void ids_of_graph_in(int fd, const std::string& by_id, std::string_view graph_sha256,
                              std::vector<ContentId>& out) {
    (void)detail::list_dir(fd, by_id, [&](std::string_view compiler, bool is_dir) {
      if (!is_dir) return;
      const std::string cdir = fmt::format("{}/{}", by_id, compiler);
      int cfd = detail::open_dir_at(AT_FDCWD, cdir.c_str());
      if (cfd < 0) return;
      (void)detail::list_dir(cfd, cdir, [&](std::string_view name, bool) {
        if (!name.starts_with(graph_sha256) || name.size() <= graph_sha256.size() || name[graph_sha256.size()] != '+')
          return;
        auto id = ContentId::parse(fmt::format("{}/{}", compiler, name));
        if (id && std::find(out.begin(), out.end(), *id) == out.end()) out.push_back(std::move(*id));
      });
    });
  }

  // The entry a record file of `id` named `name` stands for: an LNL key is the entry itself.
  static std::string entry_of(const ContentId& id, std::string_view name) {
    return is_lnl_key(name) ? std::string(name) : fmt::format("{}/{}", id.compiler_dir, name);
  }
  std::string id_dir(const ContentId& id) const { return id_dir(root_, id); }
  // The same in the index of the layer at `root`.
  static std::string id_dir(const std::string& root, const ContentId& id) {
    return fmt::format("{}/{}/by-id/{}/{}+{}", root, k_index_dir, id.compiler_dir, id.graph_sha256, id.flags_hash);
  }
  std::string record_path(const ContentId& id, const std::string& entry) const {
    return fmt::format("{}/{}", id_dir(id), std::filesystem::path(entry).filename().string());
  }
  std::string entry_path(const std::string& entry) const { return fmt::format("{}/by-entry/{}", dir(), entry); }

  // A record file, if it parses and was written by us or root.
  static std::optional<IndexRecord> read_record(const std::string& path) {
    struct stat st {};
    auto fd = detail::open_regular(path, &st);
    if (!fd || (st.st_uid != 0 && st.st_uid != ::geteuid()) || st.st_size > (64 << 10)) return std::nullopt;
    auto text = detail::read_file(path);
    if (!text) return std::nullopt;
    return IndexRecord::from_json(*text);
  }

  // Replaces `path` whole (temporary file and rename; no fsync: a record lost in a crash
  // is a twin missed, found again by the next scan).
  static Result<void> write(const std::string& path, std::string_view text) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    const std::string tmp = fmt::format("{}/.tmp-{}", parent, detail::random_hex64());
    auto create = [&] { return detail::UniqueFd(sys::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)); };
    detail::UniqueFd fd = create();
    if (!fd && errno == ENOENT) {  // the first record of its folder
      if (auto d = detail::make_dirs(parent); !d) return d;
      fd = create();
    }
    if (!fd) return sys_error("create", tmp);
    auto fail = [&](Error e) -> Result<void> {
      sys::unlink(tmp.c_str());
      return e;
    };
    if (auto w = detail::write_all(fd.get(), text, tmp); !w) return fail(w.error());
    fd.reset();
    if (sys::rename(tmp.c_str(), path.c_str()) != 0) return fail(sys_error("rename", path));
    return {};
  }

  std::string root_;
  Layers layers_;
};

// What a scan of a cache's entries added to its index.
struct IndexScan {
  std::size_t entries = 0;  // done and failed entries seen
  std::size_t added = 0;    // recorded now
  std::size_t unreadable = 0;  // without a readable HLO or flags: no identity
  bool complete = true;     // false when `max_added` or `stop` cut the scan short
  bool stopped = false;     // true when it was `stop` (the caller is going away)
};

// Records the done and failed entries of the cache that the index does not know yet
// (written by unmodified clients or other tools, or indexed before a crash), reading at
// most `max_added` HLOs. `stop` is asked between entries. Entries without an HLO (a
// client may delete it) cannot be indexed and are counted. LNL entries whose results
// record no compiler version (their clients compiled them) have no identity: passed over.
inline IndexScan index_unknown_entries(const ContentIndex& index, std::size_t max_added,
                                       const std::vector<std::string>& default_flags = {},
                                       const std::function<bool()>& stop = {}) {
  IndexScan scan;
  (void)for_each_entry(index.layers(), [&](const LayerEntryRef& at) {
    const EntryRef& ref = at.ref;
    if (!scan.complete || (!ref.files.done() && !ref.files.failed())) return;
    const std::string entry = ref.relative_path();
    const std::string entry_dir = fmt::format("{}/{}", at.root, entry);
    if (ref.files.is_lnl() && !detail::recorded_compiler_version(entry_dir)) return;
    ++scan.entries;
    if (index.knows(entry)) return;
    if (scan.added >= max_added) {
      scan.complete = false;
      return;
    }
    if (stop && stop()) {
      scan.complete = false;
      scan.stopped = true;
      return;
    }
    auto id = entry_content_id(entry_dir, default_flags);
    if (!id || !index.add(*id, entry)) {
      ++scan.unreadable;
      return;
    }
    ++scan.added;
  });
  return scan;
}

// Forgets the whole index of the cache and records every done and failed entry anew.
inline IndexScan rebuild_index(const ContentIndex& index, const std::vector<std::string>& default_flags = {}) {
  const std::string dir = index.dir();
  const std::string old = fmt::format("{}.old-{}", dir, detail::random_hex64());
  std::error_code ec;  // (remove_all removes links, never what they point at)
  if (sys::rename(dir.c_str(), old.c_str()) == 0) std::filesystem::remove_all(old, ec);
  return index_unknown_entries(index, SIZE_MAX, default_flags);
}

}  // namespace neffcache
