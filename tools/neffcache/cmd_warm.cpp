// neffcache warm MANIFEST --local-cache DIR [--cache s3://...]: before a daemon mounts a
// bucket on a fresh host, fetches the entries a run opened (a manifest, manifest.hpp)
// into the local tier it will mount, in parallel, largest first, as many as fit under
// --local-cache-size. The daemon then serves them from disk: a model with hundreds of
// graphs pays its round trips to S3 at once instead of one after another as its client
// opens them.
#include "neffcache/cmd_warm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <neffcache/cache/url.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/size.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/tier.hpp>

#include "neffcache/common.hpp"
#include "neffcache/manifest.hpp"

namespace neffcache::cli {

void setup_warm(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_command(
      app, exit_code, "warm",
      "Fetch the entries of a manifest (neffcache manifest) from a bucket into the local folder a neffcachefs mount "
      "of that bucket will show (its --local-cache), in parallel, largest first, before the model starts",
      run_warm);
  sub->add_option("MANIFEST", opts->manifest, "the manifest file")->required();
  sub->add_option("--local-cache", opts->local_cache, "the local folder of the mount (its --local-cache)")->required();
  sub->add_option("--cache", opts->cache, "the s3:// cache; default: the bucket the manifest names");
  sub->add_option("--local-cache-size", opts->local_cache_size,
                  "NEFF bytes the local folder may hold (the mount's --local-cache-size): entries past it are left")
      ->capture_default_str();
  sub->add_option("-j,--jobs", opts->jobs, "fetches at once")->capture_default_str()->check(CLI::Range(1, 256));
}

int run_warm(const WarmOptions& opts) {
  auto text = detail::read_file(opts.manifest);
  if (!text) return report(text.error());
  auto m = Manifest::parse(*text, opts.manifest);
  if (!m) return report(m.error());
  const std::string bucket = opts.cache.empty() ? m->bucket : opts.cache;
  if (bucket.empty()) return report(fmt::format("{}: names no bucket; give --cache s3://...", opts.manifest));
  auto url = parse_cache_url(bucket);
  if (!url) return report(url.error());
  if (!url->is_s3()) return report(fmt::format("{}: warm fills the local folder of an s3:// cache", bucket));
  auto cap = parse_size(opts.local_cache_size);
  if (!cap) return report(fmt::format("--local-cache-size '{}' is not a size like 50G", opts.local_cache_size));
  std::error_code ec;
  const std::string root = std::filesystem::absolute(opts.local_cache, ec).lexically_normal().string();
  std::filesystem::create_directories(root, ec);
  if (ec) return report(fmt::format("{}: {}", root, ec.message()));
  auto client = S3Client::open(*url);
  if (!client) return report(client.error());
  S3Tier::Options o;
  o.prefix = url->prefix;
  o.root = root;
  o.cap_bytes = *cap;
  S3Tier tier(std::move(*client), std::move(o));

  // Largest first, as many as fit (the manifest's sizes; an entry of unknown size counts as 0),
  // each once.
  auto items = m->entries;
  {
    std::set<std::string> seen;
    std::erase_if(items, [&](const auto& item) { return !seen.insert(item.entry).second; });
  }
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.neff_bytes > b.neff_bytes; });
  std::vector<Manifest::Item> chosen;
  uint64_t planned = 0;
  std::size_t over_cap = 0;
  for (auto& item : items) {
    if (planned + item.neff_bytes > *cap) {
      ++over_cap;
      continue;
    }
    planned += item.neff_bytes;
    chosen.push_back(std::move(item));
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0}, fetched{0}, here{0}, not_done{0}, failed{0};
  std::atomic<uint64_t> bytes{0};
  std::mutex say;
  auto work = [&] {
    for (std::size_t i; (i = next++) < chosen.size();) {
      auto got = tier.warm(chosen[i].entry);
      if (got && *got > 0) ++fetched, bytes += *got;
      else if (got) ++here;
      else if (got.error().code == Errc::not_found) ++not_done;
      else {
        ++failed;
        std::lock_guard lk(say);
        fmt::print(stderr, "neffcache: warning: {}\n", got.error().message);
      }
    }
  };
  std::vector<std::thread> threads;
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(opts.jobs), std::max<std::size_t>(chosen.size(), 1));
  for (std::size_t t = 0; t < n; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  // (One syncfs for them all, then each entry's files in place.)
  auto placed = tier.warmed();
  if (!placed) return report(placed.error());
  if (*placed < fetched.load()) failed += fetched.load() - *placed, fetched = *placed;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("warm: {} entries fetched ({}) in {:.1f} s, {} here already, {} not done in the bucket, {} past "
             "--local-cache-size, {} failed\n",
             fetched.load(), format_size(bytes.load()), secs, here.load(), not_done.load(), over_cap, failed.load());
  return failed.load() > 0 ? k_exit_error : k_exit_ok;
}

}  // namespace neffcache::cli
