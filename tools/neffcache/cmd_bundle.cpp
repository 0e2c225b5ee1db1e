// neffcache bundle create|import: a manifest's entries (manifest.hpp) as one file, for a
// host without access to the bucket.
//
// The file is a POSIX (pax) tar compressed with zstd, written and read with libarchive:
// `tar --zstd -tf` lists it anywhere, and zstd is fast enough not to slow a copy of NEFFs
// down. Its first member, neffcache-bundle.json, lists every other member with its size and
// xxh3: {"bundle": 1, "files": [{"path": "<entry>/<file>", "size": N, "xxh3": "..."}]};
// then each entry's files, in the order a copy writes them (inputs, NEFF, done marker).
//
// An import unpacks the whole bundle into a private folder first and checks every file
// against that list (and that nothing else is in it): a damaged or incomplete bundle
// imports nothing. Each entry then goes into the cache as a compile's result does, under
// the entry's lock or lease (its graph, then its NEFF, its marker last): into a folder, a
// mount (whose daemon then sees an entry a client holds, and compiles nothing) or a
// bucket. Entries done there already are left as they are. Neuron entries only: an LNL
// entry takes no graph from us (Store::put_graph).
#include "neffcache/cmd_bundle.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/flags.hpp>
#include <neffcache/compile/pipeline.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/size.hpp>
#include <neffcache/s3/sync.hpp>

#include "neffcache/common.hpp"
#include "neffcache/manifest.hpp"

namespace neffcache::cli {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view k_index_member = "neffcache-bundle.json";

struct ArchiveCloser {
  void operator()(archive* a) const { archive_free(a); }  // (closes it first)
};
using Archive = std::unique_ptr<archive, ArchiveCloser>;

Error archive_error(archive* a, const std::string& what) {
  const char* why = archive_error_string(a);
  return Error{Errc::io, fmt::format("{}: {}", what, why ? why : "archive error")};
}

// Starts a member `path` of `size` bytes.
Result<void> add_header(archive* a, const std::string& path, uint64_t size, const std::string& bundle) {
  std::unique_ptr<archive_entry, decltype(&archive_entry_free)> e(archive_entry_new(), archive_entry_free);
  archive_entry_set_pathname(e.get(), path.c_str());
  archive_entry_set_size(e.get(), static_cast<la_int64_t>(size));
  archive_entry_set_filetype(e.get(), AE_IFREG);
  archive_entry_set_perm(e.get(), 0644);
  if (archive_write_header(a, e.get()) != ARCHIVE_OK) return archive_error(a, bundle);
  return {};
}

// Adds a member `path` with the bytes of the file `file`, which must still have `size`
// bytes and the checksum `xxh3` (as listed): a file that changed since fails the bundle.
Result<void> add_member(archive* a, const std::string& path, const std::string& file, uint64_t size,
                        const std::string& xxh3, const std::string& bundle) {
  struct stat st {};
  auto fd = detail::open_regular(file, &st);
  if (!fd) return fd.error();
  if (static_cast<uint64_t>(st.st_size) != size)
    return Error{Errc::io, fmt::format("{}: {} changed while the bundle was written", bundle, path)};
  if (auto h = add_header(a, path, size, bundle); !h) return h;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::vector<char> buf(1 << 20);
  for (uint64_t done = 0; done < size;) {
    ssize_t n = sys::pread(fd->get(), buf.data(), std::min<uint64_t>(buf.size(), size - done), static_cast<off_t>(done));
    if (n <= 0) return Error{Errc::io, fmt::format("{}: {} ended early", bundle, path)};
    XXH3_64bits_update(state.get(), buf.data(), static_cast<std::size_t>(n));
    if (archive_write_data(a, buf.data(), static_cast<std::size_t>(n)) != n) return archive_error(a, bundle);
    done += static_cast<uint64_t>(n);
  }
  if (detail::xxh3_hex(XXH3_64bits_digest(state.get())) != xxh3)
    return Error{Errc::io, fmt::format("{}: {} changed while the bundle was written", bundle, path)};
  return {};
}

}  // namespace

void setup_bundle(CLI::App& app, int& exit_code) {
  auto* bundle = app.add_subcommand("bundle", "A manifest's entries as one file, for hosts without bucket access")
                     ->require_subcommand(1);
  auto [create, copts] = add_cache_command(
      *bundle, exit_code, "create",
      "Write the entries of a manifest (neffcache manifest), done in the cache, into one file (tar + zstd) with "
      "their checksums",
      run_bundle_create);
  create->add_option("MANIFEST", copts->manifest, "the manifest file")->required();
  create->add_option("-o,--output", copts->bundle, "the bundle file to write (whole or not at all)")->required();
  auto [import, iopts] = add_cache_command(
      *bundle, exit_code, "import",
      "Check every file of a bundle, then put its entries into the cache (a folder, a mount or a bucket) as a "
      "compile's results; a damaged bundle imports nothing",
      run_bundle_import);
  import->add_option("BUNDLE", iopts->bundle, "the bundle file")->required();
}

int run_bundle_create(const BundleOptions& opts) {
  auto text = detail::read_file(opts.manifest);
  if (!text) return report(text.error());
  auto m = Manifest::parse(*text, opts.manifest);
  if (!m) return report(m.error());
  auto cache = open_cache(opts.cache);
  if (!cache) return report(cache.error());
  const store::Store& c = **cache;

  // Every file first (a bucket's downloaded), with its checksum: the list leads the bundle.
  // No descriptor is kept meanwhile (a manifest may list thousands of files); each file is
  // opened again when it is written, and must still have its size and checksum.
  struct Member {
    std::string path;
    store::LocalFile file;
    uint64_t size;
    std::string xxh3;
  };
  std::vector<Member> members;
  std::size_t not_done = 0;
  for (const auto& item : m->entries) {
    auto e = c.at(item.entry);
    if (!e) return report(e.error());
    auto files = c.files(*e);
    if (!files || !files->done() || files->is_lnl()) {
      ++not_done;
      continue;
    }
    for (const auto& name : detail::sync_order(*files)) {
      EntryFiles one = EntryFiles::of_entry_path(item.entry);
      one.note(name);
      if (one.bits == 0 || !(files->bits & one.bits)) continue;  // (not a file this entry has)
      auto local = c.local_file(*e, name);
      if (!local) return report(local.error());
      struct stat st {};
      auto fd = detail::open_regular(local->path(), &st);
      if (!fd) return report(fd.error());
      auto h = detail::fd_xxh3(fd->get(), local->path());
      if (!h) return report(h.error());
      fd->reset();
      members.push_back({fmt::format("{}/{}", item.entry, name), std::move(*local), static_cast<uint64_t>(st.st_size),
                         detail::xxh3_hex(*h)});
    }
  }
  nlohmann::ordered_json index{{"bundle", 1}, {"files", nlohmann::ordered_json::array()}};
  uint64_t bytes = 0;
  for (const auto& mb : members) {
    index["files"].push_back({{"path", mb.path}, {"size", mb.size}, {"xxh3", mb.xxh3}});
    bytes += mb.size;
  }
  const std::string index_text = index.dump(2) + "\n";

  const std::string tmp = fmt::format("{}.neffcache-tmp.{}", opts.bundle, detail::random_hex64());
  Archive a(archive_write_new());
  auto fail = [&](const Error& e) {
    a.reset();
    ::unlink(tmp.c_str());
    return report(e);
  };
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_add_filter_zstd(a.get()) != ARCHIVE_OK || archive_write_open_filename(a.get(), tmp.c_str()) != ARCHIVE_OK)
    return fail(archive_error(a.get(), opts.bundle));
  if (auto h = add_header(a.get(), std::string(k_index_member), index_text.size(), opts.bundle); !h)
    return fail(h.error());
  if (archive_write_data(a.get(), index_text.data(), index_text.size()) != static_cast<la_ssize_t>(index_text.size()))
    return fail(archive_error(a.get(), opts.bundle));
  for (const auto& mb : members)
    if (auto r = add_member(a.get(), mb.path, mb.file.path(), mb.size, mb.xxh3, opts.bundle); !r) return fail(r.error());
  if (archive_write_close(a.get()) != ARCHIVE_OK) return fail(archive_error(a.get(), opts.bundle));
  a.reset();
  if (auto fd = detail::UniqueFd(::open(tmp.c_str(), O_RDONLY | O_CLOEXEC)); !fd || ::fsync(fd.get()) != 0)
    return fail(sys_error("fsync", tmp));
  if (::rename(tmp.c_str(), opts.bundle.c_str()) != 0) return fail(sys_error("rename", opts.bundle));
  fmt::print("{}: {} entries ({} files, {}){}\n", opts.bundle, m->entries.size() - not_done, members.size(),
             format_size(bytes), not_done ? fmt::format("; {} not done in {} (or LNL), left out", not_done, c.name()) : "");
  return k_exit_ok;
}

int run_bundle_import(const BundleOptions& opts) {
  auto cache = open_cache(opts.cache, Access::change);
  if (!cache) return report(cache.error());
  const store::Store& c = **cache;

  // 1. Unpack everything into a private folder, checking each file against the list.
  std::string staging = fmt::format("{}/neffcache-bundle-XXXXXX", detail::getenv_or("TMPDIR", "/tmp"));
  if (!sys::mkdtemp(staging.data())) return report(sys_error("create a folder in", detail::getenv_or("TMPDIR", "/tmp")));
  const detail::RemovedTree cleanup(staging);
  auto damaged = [&](std::string_view why) {
    return report(fmt::format("{}: a damaged bundle, nothing imported: {}", opts.bundle, why));
  };
  Archive a(archive_read_new());
  archive_read_support_format_tar(a.get());
  archive_read_support_filter_zstd(a.get());
  if (::access(opts.bundle.c_str(), R_OK) != 0) return report(sys_error("open", opts.bundle));
  if (archive_read_open_filename(a.get(), opts.bundle.c_str(), 1 << 20) != ARCHIVE_OK)
    return damaged(archive_error_string(a.get()) ? archive_error_string(a.get()) : "unreadable");
  struct Listed {
    uint64_t size;
    std::string xxh3;
    bool seen = false;
  };
  std::map<std::string, Listed> listed;
  std::vector<std::string> order;  // entries, in the bundle's order
  archive_entry* e = nullptr;
  bool saw_list = false;
  for (bool first = true;; first = false) {
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK) return damaged(archive_error_string(a.get()) ? archive_error_string(a.get()) : "unreadable");
    const std::string path = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    if (archive_entry_filetype(e) != AE_IFREG) return damaged(fmt::format("{} is not a file", path));
    std::string bytes;
    std::vector<char> buf(1 << 20);
    detail::UniqueFd out;
    XXH3_state_t* h = XXH3_createState();
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(h, XXH3_freeState);
    XXH3_64bits_reset(h);
    if (first) {
      if (path != k_index_member) return damaged(fmt::format("its first member is {}, not {}", path, k_index_member));
    } else {
      auto slash = path.rfind('/');
      auto it = listed.find(path);
      if (slash == std::string::npos || !is_entry_path(path.substr(0, slash)) || it == listed.end() || it->second.seen)
        return damaged(fmt::format("{} is not in its list, or is there twice", path));
      it->second.seen = true;
      const std::string entry = path.substr(0, slash);
      if (order.empty() || order.back() != entry) order.push_back(entry);
      std::error_code ec;
      fs::create_directories(fs::path(staging) / entry, ec);
      out = detail::UniqueFd(sys::open(fmt::format("{}/{}", staging, path).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (!out) return report(sys_error("create", fmt::format("{}/{}", staging, path)));
    }
    uint64_t total = 0;
    for (la_ssize_t n; (n = archive_read_data(a.get(), buf.data(), buf.size())) != 0;) {
      if (n < 0) return damaged(archive_error_string(a.get()) ? archive_error_string(a.get()) : "unreadable");
      total += static_cast<uint64_t>(n);
      if (!first && total > listed[path].size) return damaged(fmt::format("{} is larger than listed", path));
      if (first) {
        if (bytes.size() > (64u << 20)) return damaged("its list is too large");
        bytes.append(buf.data(), static_cast<std::size_t>(n));
      } else {
        XXH3_64bits_update(h, buf.data(), static_cast<std::size_t>(n));
        if (::write(out.get(), buf.data(), static_cast<std::size_t>(n)) != n) return report(sys_error("write", staging));
      }
    }
    if (first) {
      saw_list = true;
      auto j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("bundle") || !j["bundle"].is_number_integer() || j["bundle"] != 1 ||
          !j.contains("files") || !j["files"].is_array())
        return damaged("its list is not a neffcache bundle list (version 1)");
      for (const auto& f : j["files"]) {
        if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("size") ||
            !f["size"].is_number_unsigned() || !f.contains("xxh3") || !f["xxh3"].is_string())
          return damaged(fmt::format("a bad line in its list: {}", f.dump()));
        listed[f["path"].get<std::string>()] = {f["size"].get<uint64_t>(), f["xxh3"].get<std::string>()};
      }
      continue;
    }
    const Listed& want = listed[path];
    if (total != want.size || detail::xxh3_hex(XXH3_64bits_digest(h)) != want.xxh3)
      return damaged(fmt::format("{} is not the file listed ({} bytes, checksum differs or size {})", path, total,
                                 want.size));
  }
  if (!saw_list) return damaged(fmt::format("no {} in it", k_index_member));
  for (const auto& [path, l] : listed)
    if (!l.seen) return damaged(fmt::format("{} is listed but missing", path));
  a.reset();

  // 2. Each entry into the cache as a compile's result, under its lock or lease.
  std::size_t imported = 0, already = 0, failed = 0;
  for (const auto& path : order) {
    const std::string dir = fmt::format("{}/{}", staging, path);
    auto entry = c.at(path);
    auto staged = read_entry_files(dir);
    if (!entry || !staged || !staged->done() || !staged->hlo_name()) {
      ++failed;
      fmt::print(stderr, "neffcache: warning: {}: not a done entry with its graph in the bundle\n", path);
      continue;
    }
    auto hlo = detail::read_file(fmt::format("{}/{}", dir, *staged->hlo_name()));
    std::optional<std::string> flags_file;
    if (staged->has(EntryFile::flags)) flags_file = fmt::format("{}/{}", dir, k_compile_flags_file);
    auto flags = neuron_compiler_flags(flags_file, {});
    auto dest = c.destination(*entry);
    if (!hlo || !flags || !dest) {
      ++failed;
      fmt::print(stderr, "neffcache: warning: {}: {}\n", path,
                 !hlo ? hlo.error().message : !flags ? flags.error().message : dest.error().message);
      continue;
    }
    // A NEFF goes only beside its own graph: an entry that has a graph already must have
    // this very one (and these flags), else it is left alone.
    if (auto there = c.files(*entry); there && there->hlo_name()) {
      auto theirs = c.local_file(*entry, *there->hlo_name());
      auto their_bytes = theirs ? detail::read_file(theirs->path()) : Result<std::string>(theirs.error());
      if (!their_bytes || *their_bytes != *hlo) {
        ++failed;
        fmt::print(stderr, "neffcache: warning: {}: holds another graph than the bundle's; left alone\n", c.view(*entry));
        continue;
      }
    }
    (void)(*dest)->make();
    HeldCompile how;
    how.wait_until = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    how.look = [](const EntryFiles& files, bool) -> std::optional<CompileResult> {
      if (files.done()) return CompileResult::of(CompileOutcome::already_done);
      return std::nullopt;
    };
    CompileResult r = compile_held(**dest, how, [&](const EntryFiles&, EntryHold&) {
      Ran out;
      if (auto kept = c.put_graph(*entry, *hlo, *flags); !kept) return out.result.message = kept.error().message, out;
      out.result = CompileResult::of(CompileOutcome::success);
      out.produced.neff = fmt::format("{}/{}", dir, staged->neff_name());
      out.produced.meta = {{"imported_from", opts.bundle}};
      return out;
    });
    if (r.outcome == CompileOutcome::success) ++imported;
    else if (r.outcome == CompileOutcome::already_done) ++already;
    else {
      ++failed;
      fmt::print(stderr, "neffcache: warning: {}: {}\n", c.view(*entry), r.message);
    }
  }
  fmt::print("{}: {} entries imported into {}, {} there already, {} failed\n", opts.bundle, imported, c.name(), already,
             failed);
  return failed ? k_exit_error : k_exit_ok;
}

}  // namespace neffcache::cli
