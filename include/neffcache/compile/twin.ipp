// Definitions of compile/twin.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/twin.hpp>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

NEFFCACHE_DECL std::string root_of_entry(const std::string& entry_dir) {
  std::filesystem::path p(entry_dir);
  return (EntryFiles::of_entry_path(entry_dir).is_lnl() ? p.parent_path() : p.parent_path().parent_path()).string();
}

NEFFCACHE_DECL std::string entry_in_cache(const std::string& entry_dir) {
  std::filesystem::path p(entry_dir);
  if (EntryFiles::of_entry_path(entry_dir).is_lnl()) return p.filename().string();
  return fmt::format("{}/{}", p.parent_path().filename().string(), p.filename().string());
}

namespace detail {

NEFFCACHE_DECL Result<std::string> place_twin_neff(const Twin& twin, const std::string& tmp,
                                                   const std::optional<FileOwner>& owner) {
  struct stat st {};
  if (::fstat(twin.neff.get(), &st) != 0) return sys_error("stat", twin.record.entry);
  if (!owner || (owner->uid == st.st_uid && owner->gid == st.st_gid)) {
    const std::string self = fmt::format("/proc/self/fd/{}", twin.neff.get());
    if (sys::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) == 0) return std::string("link");
  }
  UniqueFd out(sys::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666 & ~S_IWOTH));
  if (!out) return sys_error("create", tmp);
  give(out.get(), owner);
  auto fail = [&](Error e) -> Result<std::string> {
    sys::unlink(tmp.c_str());
    return e;
  };
  if (::ioctl(out.get(), FICLONE, twin.neff.get()) == 0) {
    if (sys::fsync(out.get()) != 0) return fail(sys_error("fsync", tmp));
    return std::string("reflink");
  }
  // The checksum is taken of the very bytes copied: a file changed since the index
  // checked it is refused, never published under the record's checksum.
  auto copied = copy_hashed(twin.neff.get(), twin.record.entry, out.get(), tmp);
  if (!copied) return fail(copied.error());
  if (xxh3_hex(*copied) != twin.record.xxh3)
    return fail(
        Error{Errc::invalid_argument, fmt::format("{}: model.neff changed while it was copied", twin.record.entry)});
  if (sys::fsync(out.get()) != 0) return fail(sys_error("fsync", tmp));
  return std::string("copy");
}

NEFFCACHE_DECL Result<void> place_twin_failure(const std::string& source_dir, const std::string& entry_dir,
                                               const std::optional<FileOwner>& owner) {
  const OwnFiles own = own_files(entry_dir);
  if (auto m = own.make(); !m) return m;
  const std::string tmp = own.temporary("log");
  auto c = copy_file_hashed(failure_record(source_dir), tmp, 0644, owner);
  if (!c) return c.error();
  if (sys::rename(tmp.c_str(), own.failure.c_str()) != 0) {
    sys::unlink(tmp.c_str());
    return sys_error("record failure in", entry_dir);
  }
  fsync_dir(own.dir);
  return {};
}

NEFFCACHE_DECL Result<std::string> publish_twin_neff(const Twin& twin, const std::string& entry_dir,
                                                     const EntryFiles& files, const std::optional<FileOwner>& owner,
                                                     const std::optional<std::string>& compiler_version) {
  const std::string tmp = neff_tmp_name(entry_dir);
  auto how = place_twin_neff(twin, tmp, owner);
  if (!how) return how.error();
  nlohmann::ordered_json meta{{"copied_from", twin.record.entry},
                              {"copy", *how},
                              {"compile_seconds_saved", twin.record.compile_seconds}};
  if (files.is_lnl() && compiler_version) meta["compiler_version"] = *compiler_version;
  return commit_neff(entry_dir, tmp, twin.record.xxh3, std::move(meta), owner, files);
}

}  // namespace detail

NEFFCACHE_DECL CompileResult serve_twin(const Twin& twin, const std::string& entry_dir, const CompileSettings& s) {
  CompileResult r;
  auto end = [&](CompileOutcome o, std::string why) {
    r.outcome = o;
    r.message = std::move(why);
    return r;
  };
  auto files = read_entry_files(entry_dir);
  if (!files) return end(CompileOutcome::transient, files.error().message);
  auto lock = EntryLock::try_acquire_entry(entry_dir, *files, s.lock);
  if (!lock)
    return end(lock.error().code == Errc::busy ? CompileOutcome::busy : CompileOutcome::transient,
               lock.error().message);
  files = read_entry_files(entry_dir);
  if (!files) return end(CompileOutcome::transient, files.error().message);
  if (auto o = settled_outcome(*files, s.retry_failed)) return end(*o, "");
  remove_publish_leftovers(entry_dir);
  const auto owner =
      files->hlo_name() ? detail::entry_owner(fmt::format("{}/{}", entry_dir, *files->hlo_name())) : std::nullopt;
  const std::string source_dir =
      twin.dir.empty() ? fmt::format("{}/{}", root_of_entry(entry_dir), twin.record.entry) : twin.dir;
  if (twin.record.failed) {
    if (auto p = detail::place_twin_failure(source_dir, entry_dir, owner); !p)
      return end(CompileOutcome::transient, p.error().message);
    r.twin = twin.record.entry;
    return end(CompileOutcome::failed, fmt::format("same graph as {}, which failed", twin.record.entry));
  }
  sys::unlink(own_files(entry_dir).failure.c_str());
  // An LNL entry keeps the version its identity named: its own identity, later.
  auto p = detail::publish_twin_neff(twin, entry_dir, *files, owner,
                                     files->is_lnl() ? compiler_version(s) : std::nullopt);
  if (!p) return end(CompileOutcome::transient, p.error().message);
  r.twin = twin.record.entry;
  r.saved_seconds = twin.record.compile_seconds;
  return end(CompileOutcome::success, "");
}

NEFFCACHE_DECL std::optional<std::string> identity_compiler_dir(const std::string& entry_dir,
                                                                const CompileSettings& s) {
  if (!EntryFiles::of_entry_path(entry_dir).is_lnl()) return compiler_dir_of(entry_dir);
  auto v = compiler_version(s);
  if (!v) return std::nullopt;
  return compiler_dir_name(*v);
}

NEFFCACHE_DECL CompileResult copy_result(const std::string& source_dir, const std::string& entry_dir,
                                         const CompileSettings& s) {
  auto transient = [](std::string why) { return CompileResult::of(CompileOutcome::transient, std::move(why)); };
  auto source = read_entry_files(source_dir);
  if (!source) return transient(source.error().message);
  // Across dialects, the result must be of the compiler the identity named: an LNL
  // entry's client may have compiled it, with a compiler nobody can name.
  if (source->is_lnl() || EntryFiles::of_entry_path(entry_dir).is_lnl()) {
    // (A failure record is ours alone, of the compile this job just ran: of the compiler
    // the source's identity names now.)
    auto made_by = source->failed() ? identity_compiler_dir(source_dir, s) : result_compiler_dir(source_dir, *source);
    auto wanted = identity_compiler_dir(entry_dir, s);
    if (!made_by || made_by != wanted)
      return transient(
          fmt::format("{} holds no result of the compiler {} would be compiled with", source_dir, entry_dir));
  }
  Twin twin;
  twin.record.entry = entry_in_cache(source_dir);
  twin.dir = source_dir;
  if (source->failed()) {
    twin.record.failed = true;
    return serve_twin(twin, entry_dir, s);
  }
  if (!source->done()) return transient(fmt::format("{} has no result to copy", source_dir));
  struct stat st {};
  auto fd = detail::open_regular(fmt::format("{}/{}", source_dir, source->neff_name()), &st);
  if (!fd) return transient(fd.error().message);
  auto h = detail::neff_xxh3(source_dir, fd->get(), st);
  if (!h) return transient(h.error().message);
  twin.record.xxh3 = std::move(*h);
  if (const auto meta = detail::read_entry_meta(source_dir); meta.contains("compile_seconds") && meta["compile_seconds"].is_number())
    twin.record.compile_seconds = meta["compile_seconds"].get<double>();
  twin.record.size = static_cast<uint64_t>(st.st_size);
  twin.neff = std::move(*fd);
  return serve_twin(twin, entry_dir, s);
}

NEFFCACHE_DECL std::optional<CompileResult> folder_reuse(const std::string& entry_dir, const std::string& key,
                                                         const CompileSettings& s,
                                                         const std::vector<std::string>& lowers) {
  auto id = ContentId::parse(key);
  if (!id || !s.content_index) return std::nullopt;
  ContentIndex index(root_of_entry(entry_dir), lowers);
  auto twin = index.find(*id, entry_in_cache(entry_dir), !s.retry_failed, s.log);
  if (!twin) return std::nullopt;
  CompileResult r = serve_twin(*twin, entry_dir, s);
  // A twin that could not be served is no answer: the compile path takes over (a held
  // lock is found busy there too).
  if (r.outcome == CompileOutcome::transient || r.outcome == CompileOutcome::busy) return std::nullopt;
  return r;
}

NEFFCACHE_DECL void folder_record(const std::string& entry_dir, const std::string& key, const CompileResult& r,
                                  const CompileSettings& s, const std::vector<std::string>& lowers) {
  auto id = ContentId::parse(key);
  if (!id || !s.content_index) return;
  if (r.outcome != CompileOutcome::success && r.outcome != CompileOutcome::failed &&
      r.outcome != CompileOutcome::already_done)
    return;
  // An LNL entry's result is recorded only under the version that made it: ours, as our
  // record says (a client may have compiled it meanwhile: already_done), or, for a failure,
  // a compile we ran just now.
  if (EntryFiles::of_entry_path(entry_dir).is_lnl()) {
    auto files = read_entry_files(entry_dir);
    if (!files) return;
    if (r.outcome == CompileOutcome::failed ? r.attempts == 0
                                            : result_compiler_dir(entry_dir, *files) != id->compiler_dir)
      return;
  }
  ContentIndex index(root_of_entry(entry_dir), lowers);
  std::optional<double> seconds;
  if (r.attempts > 0 && r.outcome == CompileOutcome::success) seconds = r.compile_seconds;
  if (auto a = index.add(*id, entry_in_cache(entry_dir), seconds); !a && s.log)
    s.log(fmt::format("content index: {} not recorded: {}", entry_dir, a.error().message));
}

}  // namespace neffcache
