// neffcache sync push|pull DIR s3://bucket/prefix: copy a directory cache to S3 or back.
#include "neffcache/cmd_sync.hpp"

#include <fmt/format.h>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/sync.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_sync(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_command(app, exit_code, "sync",
                                 "Copy entries between a directory cache and an s3:// cache: push uploads DIR, pull "
                                 "downloads into DIR. Files already there with the same size are skipped; model.done "
                                 "goes after its NEFF. NKI kernels that graphs call go with them (push: before "
                                 "the entries calling them; pull: first), and so does LNL's nki/ folder",
                                 run_sync);
  sub->add_option("direction", opts->direction, "push or pull")->required()->check(CLI::IsMember({"push", "pull"}));
  sub->add_option("dir", opts->dir, "the directory cache")->required();
  sub->add_option("url", opts->url, "the S3 cache, s3://bucket[/prefix]")->required();
  sub->add_option("-j,--jobs", opts->jobs, "transfers at a time")->capture_default_str()->check(CLI::Range(1, 256));
  sub->add_option("--nki-kernels", opts->nki_kernels,
                  fmt::format("the folder of the NKI kernel binaries that graphs call by path (default: ${}, else {})",
                              k_nki_kernel_dir_env, k_default_nki_kernel_dir));
}

int run_sync(const SyncOptions& opts) {
  auto url = parse_cache_url(opts.url);
  if (!url) return report(url.error());
  if (!url->is_s3()) return report(fmt::format("{}: sync needs an s3:// URL", opts.url));
  bool push = opts.direction == "push";
  if (push && !std::filesystem::is_directory(opts.dir)) return report(fmt::format("{}: not a directory", opts.dir));
  SyncSettings settings;
  settings.jobs = opts.jobs;
  if (!opts.nki_kernels.empty()) settings.nki_kernels = opts.nki_kernels;
  if (!settings.nki_kernels.starts_with('/'))
    return report(fmt::format("--nki-kernels {}: the kernel folder must be an absolute path, as graphs name kernels",
                              settings.nki_kernels));
  auto s3 = S3Client::open(*url);
  if (!s3) return report(s3.error());
  auto stats = push ? sync_push(opts.dir, **s3, url->prefix, settings) : sync_pull(opts.dir, **s3, url->prefix, settings);
  if (!stats) return report(stats.error());
  for (const auto& w : stats->warnings) fmt::print(stderr, "neffcache: sync: warning: {}\n", w);
  for (const auto& f : stats->failures) fmt::print(stderr, "neffcache: sync: {}\n", f);
  fmt::print("{} {} entries: {} files copied ({} bytes), {} already there, {} failed\n",
             push ? "pushed" : "pulled", stats->entries, stats->copied, stats->bytes, stats->skipped,
             stats->failures.size());
  if (!stats->failures.empty())
    return report(fmt::format("{} files could not be copied; run the same command again to resume",
                              stats->failures.size()));
  return k_exit_ok;
}

}  // namespace neffcache::cli
