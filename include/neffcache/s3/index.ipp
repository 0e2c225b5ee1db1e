// Definitions of s3/index.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/index.hpp>

#include <fcntl.h>

#include <filesystem>
#include <set>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/lnl.hpp>
#include <neffcache/core/detail/sys.hpp>

namespace neffcache {

namespace detail {

// Errors of S3 itself (unreachable, refused), which say nothing of what a record says.
inline bool s3_trouble(const Error& e) {
  return e.code == Errc::io || e.code == Errc::timed_out || e.code == Errc::denied;
}

}  // namespace detail

NEFFCACHE_DECL std::string S3Index::id_prefix(const ContentId& id) const {
  return s3_key(prefix_, fmt::format("{}/by-id/{}/{}+{}/", k_index_dir, id.compiler_dir, id.graph_sha256, id.flags_hash));
}

NEFFCACHE_DECL std::string S3Index::record_key(const ContentId& id, const std::string& entry) const {
  return id_prefix(id) + std::filesystem::path(entry).filename().string();
}

NEFFCACHE_DECL std::string S3Index::entry_key(const std::string& entry) const {
  return s3_key(prefix_, fmt::format("{}/by-entry/{}", k_index_dir, entry));
}

NEFFCACHE_DECL Result<std::string> S3Index::lnl_compiler_version(const std::string& entry,
                                                                 const EntryFiles& files) const {
  const std::string base = s3_key(prefix_, entry);
  auto none = [&](std::string_view why) {
    return Error{Errc::not_found, fmt::format("{}: {} (an LNL entry's identity names the compiler version of our record)",
                                              s3_.describe(base), why)};
  };
  if (!files.done()) return none("not done");
  auto text = s3_.get(fmt::format("{}/{}", base, k_meta_file));
  if (!text) return text.error().code == Errc::not_found ? none("no record") : text.error();
  const auto j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("compiler_version") || !j["compiler_version"].is_string() ||
      !check_compiler_version(j["compiler_version"].get<std::string>()) || !j.contains("size") ||
      !j["size"].is_number_unsigned() || !j.contains("etag") || !j["etag"].is_string())
    return none("its record names no compiler version, NEFF size and ETag");
  // A record describes the NEFF it was written with (a NEFF replaced since, by a compile of
  // another version or anyone, has another ETag).
  auto neff = s3_.head(fmt::format("{}/{}", base, files.neff_name()));
  if (!neff) return neff.error();
  if (neff->size != j["size"].get<uint64_t>() || neff->etag.empty() ||
      detail::unquote(neff->etag) != detail::unquote(j["etag"].get<std::string>()))
    return none("its record describes another NEFF");
  return j["compiler_version"].get<std::string>();
}

NEFFCACHE_DECL Result<ContentId> S3Index::entry_id(const std::string& entry, const EntryFiles& files) const {
  if (!indexes(entry)) return Error{Errc::invalid_argument, fmt::format("{}: not an entry path", entry)};
  if (!files.has_hlo()) return Error{Errc::not_found, fmt::format("{}: no HLO", s3_.describe(s3_key(prefix_, entry)))};
  std::string version;
  if (files.is_lnl()) {
    auto v = lnl_compiler_version(entry, files);
    if (!v) return v.error();
    version = std::move(*v);
  }
  const std::string root = scratch_.empty() ? detail::getenv_or("TMPDIR", "/tmp") : scratch_;
  detail::RemovedTree scratch;
  auto staged = detail::stage_s3_inputs(s3_, prefix_, entry, files, root, scratch.dir);
  if (!staged) return staged.error();
  // (Staged, an LNL entry holds only its inputs: keyed with the version given.)
  return entry_content_id(*staged, default_flags_, version);
}

NEFFCACHE_DECL Result<IndexRecord> S3Index::add(const ContentId& id, const std::string& entry, bool failed,
                                                std::string xxh3, double compile_seconds) const {
  if (!can_hold(entry, id))
    return Error{Errc::invalid_argument, fmt::format("{}: cannot hold a result of {}", entry, id.str())};
  IndexRecord r;
  r.entry = entry;
  r.failed = failed;
  r.compile_seconds = compile_seconds;
  if (!failed) {
    auto neff = s3_.head(fmt::format("{}/{}", s3_key(prefix_, entry), EntryFiles::of_entry_path(entry).neff_name()));
    if (!neff) return neff.error();
    r.size = neff->size;
    r.etag = neff->etag;
    r.xxh3 = std::move(xxh3);
  }
  if (auto put = s3_.put(record_key(id, entry), r.to_json().dump() + "\n"); !put) return put.error();
  if (auto put = s3_.put(entry_key(entry), id.str() + "\n"); !put) return put.error();
  return r;
}

NEFFCACHE_DECL std::vector<IndexRecord> S3Index::records(const ContentId& id) const {
  std::vector<IndexRecord> out;
  const std::string under = id_prefix(id);
  auto listing = s3_.list(under, "/");
  if (!listing) return out;
  for (const auto& o : listing->objects) {
    const std::string name = o.key.substr(under.size());
    if (!is_entry_folder(name)) continue;
    auto text = s3_.get(o.key);
    if (!text) continue;
    auto r = IndexRecord::from_json(*text);
    // A record stands for the entry its key names.
    if (r && r->entry == ContentIndex::entry_of(id, name)) out.push_back(std::move(*r));
  }
  return out;
}

NEFFCACHE_DECL Result<IndexRecord> S3Index::check(const ContentId& id, const IndexRecord& r) const {
  const std::string base = s3_key(prefix_, r.entry);
  auto bad = [&](std::string_view why) {
    return Error{Errc::invalid_argument, fmt::format("{}: {}", s3_.describe(base), why)};
  };
  if (!can_hold(r.entry, id)) return bad(fmt::format("not an entry that can hold a result of {}", id.str()));
  auto listing = s3_.list(base + "/", "/");
  if (!listing) return listing.error();
  EntryFiles files = EntryFiles::of_entry_path(r.entry);
  std::optional<ObjectInfo> neff;
  for (const auto& o : listing->objects) {
    const std::string name = o.key.substr(base.size() + 1);
    files.note(name);
    if (name == files.neff_name()) neff = o;
  }
  if (r.failed && !files.failed()) return bad("holds no recorded failure");
  if (!r.failed) {
    if (!files.done()) return bad("is not done");
    if (!neff || neff->size != r.size || r.etag.empty() || detail::unquote(neff->etag) != detail::unquote(r.etag))
      return bad("its NEFF is not the one recorded");
  }
  auto own = entry_id(r.entry, files);
  if (!own) return detail::s3_trouble(own.error()) ? own.error() : bad(own.error().message);
  // An entry without compile_flags.json is keyed with the flags NEURON_CC_FLAGS gives, which
  // may differ between hosts: a record made elsewhere is then no lie, only not ours to use.
  if (*own != id && !files.has(EntryFile::flags) && own->compiler_dir == id.compiler_dir &&
      own->graph_sha256 == id.graph_sha256)
    return Error{Errc::precondition_failed,
                 fmt::format("{}: keyed with other default flags than this host's", s3_.describe(base))};
  if (*own != id) return bad(fmt::format("its own graph and flags are {}, not {}", own->str(), id.str()));
  return r;
}

NEFFCACHE_DECL std::optional<IndexRecord> S3Index::find(const ContentId& id, std::string_view except,
                                                        bool with_failures,
                                                        const std::function<void(std::string_view)>& log,
                                                        bool drop) const {
  for (const auto& r : records(id)) {
    if (r.entry == except || (r.failed && !with_failures)) continue;
    auto checked = check(id, r);
    if (checked) return std::move(*checked);
    // Only a record that says what is not so goes (not one S3 could not check just now).
    if (checked.error().code != Errc::invalid_argument || !drop) continue;
    forget(id, r.entry);
    if (log) log(fmt::format("content index: dropped a record: {}", checked.error().message));
  }
  return std::nullopt;
}

NEFFCACHE_DECL std::optional<ContentId> S3Index::id_of(const std::string& entry) const {
  auto text = s3_.get(entry_key(entry));
  if (!text) return std::nullopt;
  while (!text->empty() && (text->back() == '\n' || text->back() == ' ')) text->pop_back();
  return ContentId::parse(*text);
}

NEFFCACHE_DECL Result<std::vector<std::string>> S3Index::entries() const {
  const std::string under = entry_key("");
  auto listing = s3_.list(under);
  if (!listing) return listing.error();
  std::vector<std::string> out;
  for (const auto& o : listing->objects)
    if (std::string entry = o.key.substr(under.size()); indexes(entry)) out.push_back(std::move(entry));
  return out;
}

NEFFCACHE_DECL void S3Index::forget(const ContentId& id, const std::string& entry) const {
  (void)s3_.remove(record_key(id, entry));
  if (id_of(entry) == id) (void)s3_.remove(entry_key(entry));
}

namespace detail {

NEFFCACHE_DECL Result<void> serve_s3_twin(S3Client& s3, const std::string& base, const EntryFiles& files,
                                          const std::string& twin_base, const ContentId& id, const IndexRecord& twin) {
  // (Its files are named as its dialect and key name them: an LNL NEFF names its key.)
  const EntryFiles source = EntryFiles::of_entry_path(twin.entry);
  if (twin.failed) {
    if (auto c = s3.copy(fmt::format("{}/{}", twin_base, source.failure_name()),
                         fmt::format("{}/{}", base, files.failure_name()));
        !c)
      return c.error();
    return {};
  }
  auto copied = s3.copy(fmt::format("{}/{}", twin_base, source.neff_name()),
                        fmt::format("{}/{}", base, files.neff_name()), twin.etag);
  if (!copied) return copied.error();
  // Its record, as a folder's twin has one (compile/twin.hpp): what `stats` counts. Best
  // effort, before the marker: a reader of a done entry finds it whole.
  // (With the NEFF's checksum: a host that holds the original links it instead of a fetch.)
  // (An LNL twin's names the compiler version too: it is a twin for others in turn.)
  nlohmann::ordered_json record;
  if (files.is_lnl())
    record = s3_lnl_record(std::string_view(id.compiler_dir).substr(k_compiler_dir_prefix.size()), twin.size, *copied);
  record["copied_from"] = twin.entry;
  record["compile_seconds_saved"] = twin.compile_seconds;
  if (!twin.xxh3.empty()) record["xxh3"] = twin.xxh3;
  (void)s3.put(fmt::format("{}/{}", base, k_meta_file), record.dump() + "\n");
  return mark_s3_done(s3, base, files, files.is_lnl() ? lnl_marker(unix_time_now(), twin.size) : std::string());
}

}  // namespace detail

NEFFCACHE_DECL S3CompileOptions::Reuse s3_index_reuse(S3Client& s3, std::string prefix) {
  return [&s3, prefix = std::move(prefix)](const std::string& rel, const std::string& staged, const EntryFiles& files,
                                           const CompileSettings& s) -> std::optional<CompileResult> {
    if (!s.content_index || !S3Index::indexes(rel)) return std::nullopt;
    // (An LNL entry to compile is keyed with the version that would compile it.)
    auto id = entry_content_id(staged, s.default_flags, compiler_version(s).value_or(""));
    if (!id) return std::nullopt;  // (its compile says what is wrong with its inputs)
    const S3Index index(s3, prefix, s.default_flags, s.workdir_root);
    auto twin = index.find(*id, rel, /*with_failures=*/!s.retry_failed, s.log);
    if (!twin) return std::nullopt;
    const std::string base = s3_key(prefix, rel);
    if (auto served = detail::serve_s3_twin(s3, base, files, s3_key(prefix, twin->entry), *id, *twin); !served) {
      // Compiled instead: a twin that went meanwhile costs a compile, never a wrong NEFF.
      if (s.log) s.log(fmt::format("content index: {} not served from {}: {}", rel, twin->entry, served.error().message));
      return std::nullopt;
    }
    if (auto added = index.add(*id, rel, twin->failed, twin->xxh3, twin->compile_seconds); !added && s.log)
      s.log(fmt::format("content index: {} not recorded: {}", rel, added.error().message));
    CompileResult r = CompileResult::of(
        twin->failed ? CompileOutcome::failed : CompileOutcome::success,
        twin->failed ? fmt::format("same graph as {}, which failed", s3.describe(s3_key(prefix, twin->entry))) : "");
    r.twin = twin->entry;
    r.saved_seconds = twin->failed ? 0 : twin->compile_seconds;
    return r;
  };
}

NEFFCACHE_DECL S3CompileOptions::Record s3_index_record(S3Client& s3, std::string prefix) {
  return [&s3, prefix = std::move(prefix)](const std::string& rel, const std::string& staged, const CompileResult& r,
                                           const CompileSettings& s) {
    if (!s.content_index || !S3Index::indexes(rel)) return;
    auto id = entry_content_id(staged, s.default_flags);
    if (!id) return;
    const bool failed = r.outcome == CompileOutcome::failed;
    std::string xxh3;
    if (!failed)
      if (auto h = detail::file_xxh3(fmt::format("{}/{}", staged, EntryFiles::of_entry_path(rel).neff_name())))
        xxh3 = detail::xxh3_hex(*h);
    const S3Index index(s3, prefix, s.default_flags, s.workdir_root);
    if (auto added = index.add(*id, rel, failed, std::move(xxh3), r.compile_seconds); !added && s.log)
      s.log(fmt::format("content index: {} not recorded: {}", rel, added.error().message));
  };
}

NEFFCACHE_DECL S3IndexScan scan_s3_index(const S3Index& index, const std::vector<EntryInfo>& listing, bool rebuild) {
  S3IndexScan scan;
  std::set<std::string> known;
  if (auto entries = index.entries()) known.insert(entries->begin(), entries->end());
  std::set<std::string> settled;
  for (const auto& info : listing) {
    if (!S3Index::indexes(info.path) || (info.state != EntryState::done && info.state != EntryState::failed)) continue;
    ++scan.entries;
    settled.insert(info.path);
    if (known.contains(info.path) && !rebuild) continue;
    auto id = index.entry_id(info.path, info.files);
    if (!id) {
      ++scan.unreadable;
      continue;
    }
    if (rebuild) index.forget(info.path);
    if (index.add(*id, info.path, info.state == EntryState::failed, {}, info.compile_seconds.value_or(0)))
      ++scan.added;
  }
  for (const auto& entry : known)
    if (!settled.contains(entry)) {
      index.forget(entry);
      ++scan.forgotten;
    }
  return scan;
}

}  // namespace neffcache
