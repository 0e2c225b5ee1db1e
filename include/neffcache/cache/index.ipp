// Definitions of cache/index.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/index.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

NEFFCACHE_DECL std::string ContentId::str() const {
  return fmt::format("{}/{}+{}", compiler_dir, graph_sha256, flags_hash);
}

NEFFCACHE_DECL std::optional<ContentId> ContentId::parse(std::string_view s) {
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

namespace detail {

NEFFCACHE_DECL std::optional<std::string> recorded_compiler_version(const std::string& entry_dir, bool legacy) {
  const std::string neff_path = fmt::format("{}/{}", entry_dir, EntryFiles::of_entry_path(entry_dir).neff_name());
  struct stat meta_st {}, neff_st {};
  if (::stat(neff_path.c_str(), &neff_st) != 0) return std::nullopt;
  const auto j = read_entry_meta(entry_dir, &meta_st, legacy);
  if (!j.contains("compiler_version") || !j["compiler_version"].is_string() || !record_describes(j, meta_st, neff_st))
    return std::nullopt;
  auto v = j["compiler_version"].get<std::string>();
  if (!check_compiler_version(v)) return std::nullopt;
  return v;
}

}  // namespace detail

NEFFCACHE_DECL std::optional<std::string> lnl_identity_compiler_dir(const std::string& entry_dir,
                                                                    const EntryFiles& files,
                                                                    std::string_view compiler_version) {
  std::optional<std::string> v;
  if (files.done() || files.failed()) v = detail::recorded_compiler_version(entry_dir);
  else if (!compiler_version.empty() && check_compiler_version(compiler_version)) v = std::string(compiler_version);
  if (!v) return std::nullopt;
  return compiler_dir_name(*v);
}

NEFFCACHE_DECL Result<ContentId> entry_content_id(const std::string& entry_dir,
                                                  const std::vector<std::string>& default_flags,
                                                  std::string_view compiler_version) {
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

NEFFCACHE_DECL nlohmann::ordered_json IndexRecord::to_json() const {
  nlohmann::ordered_json j{{"entry", entry}, {"result", failed ? "failure" : "neff"}, {"size", size}, {"xxh3", xxh3},
                           {"compile_seconds", compile_seconds}, {"ino", ino}, {"mtime_ns", mtime_ns}};
  if (!etag.empty()) j["etag"] = etag;
  return j;
}

NEFFCACHE_DECL std::optional<IndexRecord> IndexRecord::from_json(std::string_view text) {
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
  if (!str("entry", r.entry) || !str("result", result) || (result != "neff" && result != "failure"))
    return std::nullopt;
  r.failed = result == "failure";
  (void)str("etag", r.etag);
  // A folder's record has a checksum; a bucket's an ETag, and its checksum when known.
  bool checksum = str("xxh3", r.xxh3) && (r.xxh3.size() == 16 || (r.xxh3.empty() && !r.etag.empty()));
  if (!r.failed && (!uint("size", r.size) || !checksum || !uint("ino", r.ino) || !uint("mtime_ns", r.mtime_ns)))
    return std::nullopt;
  if (j.contains("compile_seconds") && j["compile_seconds"].is_number())
    r.compile_seconds = std::max(0.0, j["compile_seconds"].get<double>());
  return r;
}

namespace detail {

NEFFCACHE_DECL Result<std::string> neff_xxh3(const std::string& entry_dir, int fd, const struct stat& st) {
  struct stat mst {};
  const auto meta = read_entry_meta(entry_dir, &mst);
  if (meta.contains("xxh3") && meta["xxh3"].is_string() && record_describes(meta, mst, st))
    return meta["xxh3"].get<std::string>();
  auto h = fd_xxh3(fd, entry_dir);
  if (!h) return h.error();
  return xxh3_hex(*h);
}

}  // namespace detail

NEFFCACHE_DECL std::string ContentIndex::dir() const {
  return fmt::format("{}/{}", root_, k_index_dir);
}

NEFFCACHE_DECL Result<IndexRecord> ContentIndex::add(const ContentId& id, const std::string& entry,
                                                     std::optional<double> compile_seconds) const {
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
    auto h = detail::neff_xxh3(entry_dir, fd->get(), st);
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

NEFFCACHE_DECL std::vector<IndexRecord> ContentIndex::records(const ContentId& id) const {
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

NEFFCACHE_DECL std::optional<Twin> ContentIndex::find(const ContentId& id, std::string_view except, bool with_failures,
                                                      const std::function<void(std::string_view)>& log) const {
  for (auto& r : records(id)) {
    if (r.entry == except || (r.failed && !with_failures)) continue;
    auto twin = check(r);
    if (twin) return std::move(*twin);
    forget(id, r.entry);
    if (log) log(fmt::format("content index: dropped {} for {}: {}", r.entry, id.str(), twin.error().message));
  }
  return std::nullopt;
}

NEFFCACHE_DECL std::vector<ContentId> ContentIndex::ids_of_graph(std::string_view graph_sha256) const {
  std::vector<ContentId> out;
  for (const auto& root : layers_.roots()) {
    const std::string by_id = fmt::format("{}/{}/by-id", root, k_index_dir);
    int fd = detail::open_dir_at(AT_FDCWD, by_id.c_str());
    if (fd >= 0) ids_of_graph_in(fd, by_id, graph_sha256, out);
  }
  return out;
}

NEFFCACHE_DECL std::optional<ContentId> ContentIndex::id_of(const std::string& entry) const {
  auto text = detail::read_file(entry_path(entry));
  if (!text) return std::nullopt;
  std::string_view t = *text;
  while (!t.empty() && t.back() == '\n') t.remove_suffix(1);
  return ContentId::parse(t);
}

NEFFCACHE_DECL void ContentIndex::forget(const ContentId& id, const std::string& entry) const {
  sys::unlink(record_path(id, entry).c_str());
  if (auto mine = id_of(entry); mine && *mine == id) sys::unlink(entry_path(entry).c_str());
  for (const auto& d : {id_dir(id), fmt::format("{}/by-id/{}", dir(), id.compiler_dir), fmt::format("{}/by-id", dir()),
                        fmt::format("{}/by-entry/{}", dir(), id.compiler_dir), fmt::format("{}/by-entry", dir()), dir(),
                        fmt::format("{}/{}", root_, k_private_prefix)})
    ::rmdir(d.c_str());
}

NEFFCACHE_DECL bool ContentIndex::knows(const std::string& entry) const {
  return ::access(entry_path(entry).c_str(), F_OK) == 0;
}

NEFFCACHE_DECL Result<Twin> ContentIndex::check(const IndexRecord& r) const {
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

NEFFCACHE_DECL void ContentIndex::ids_of_graph_in(int fd, const std::string& by_id, std::string_view graph_sha256,
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

NEFFCACHE_DECL std::string ContentIndex::entry_of(const ContentId& id, std::string_view name) {
  return is_lnl_key(name) ? std::string(name) : fmt::format("{}/{}", id.compiler_dir, name);
}

NEFFCACHE_DECL std::string ContentIndex::id_dir(const std::string& root, const ContentId& id) {
  return fmt::format("{}/{}/by-id/{}/{}+{}", root, k_index_dir, id.compiler_dir, id.graph_sha256, id.flags_hash);
}

NEFFCACHE_DECL std::string ContentIndex::record_path(const ContentId& id, const std::string& entry) const {
  return fmt::format("{}/{}", id_dir(id), std::filesystem::path(entry).filename().string());
}

NEFFCACHE_DECL std::string ContentIndex::entry_path(const std::string& entry) const {
  return fmt::format("{}/by-entry/{}", dir(), entry);
}

NEFFCACHE_DECL std::optional<IndexRecord> ContentIndex::read_record(const std::string& path) {
  struct stat st {};
  auto fd = detail::open_regular(path, &st);
  if (!fd || (st.st_uid != 0 && st.st_uid != ::geteuid()) || st.st_size > (64 << 10)) return std::nullopt;
  auto text = detail::read_file(path);
  if (!text) return std::nullopt;
  return IndexRecord::from_json(*text);
}

NEFFCACHE_DECL Result<void> ContentIndex::write(const std::string& path, std::string_view text) {
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

NEFFCACHE_DECL IndexScan index_unknown_entries(const ContentIndex& index, std::size_t max_added,
                                               const std::vector<std::string>& default_flags,
                                               const std::function<bool()>& stop) {
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

NEFFCACHE_DECL IndexScan rebuild_index(const ContentIndex& index, const std::vector<std::string>& default_flags) {
  const std::string dir = index.dir();
  const std::string old = fmt::format("{}.old-{}", dir, detail::random_hex64());
  std::error_code ec;  // (remove_all removes links, never what they point at)
  if (sys::rename(dir.c_str(), old.c_str()) == 0) std::filesystem::remove_all(old, ec);
  return index_unknown_entries(index, SIZE_MAX, default_flags);
}

}  // namespace neffcache
