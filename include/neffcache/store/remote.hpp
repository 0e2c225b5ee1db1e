// What a daemon's local folder has elsewhere, as ccache composes its local storage with
// remote ones: the bucket behind the local tier of an S3 cache (store/tier.hpp). The
// daemon tells a store's remote (Store::remote) what happens in the folder it mounts: a
// lookup that found nothing, a listing, a hit, a finished write, a folder renamed onto an
// entry's name. A plain directory has nothing elsewhere: its remote is this class itself,
// which does nothing at each of them, so that no caller asks what kind of cache it serves.
// The calls of a lookup, a listing and a hit take the local folder's or file's descriptor
// (an O_PATH one will do): only a remote with work to do turns it into a path.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/cache/lock.hpp>

namespace neffcache::store {

class Remote {
 public:
  Remote() = default;
  Remote(const Remote&) = delete;
  Remote& operator=(const Remote&) = delete;
  virtual ~Remote() = default;

  // A lookup of `name` in the local folder `dir` found nothing: makes it from elsewhere if
  // it is there. True if something was made.
  virtual bool fill(int /*dir*/, std::string_view /*name*/) const { return false; }
  // Before the local folder `dir` is listed: brings in the names it has elsewhere.
  virtual void fill_listing(int /*dir*/) const {}
  // The names a listing of the local entry folder `dir` shows beside its own files: the
  // products of an entry that is done elsewhere and not fetched yet (a lookup finds them,
  // and their open fetches them), so that a copy of the folder is whole, as a copy of a
  // folder on a file server would be.
  virtual std::vector<std::string> names_elsewhere(int /*dir*/) const { return {}; }
  // The lock file `lock_name` (an entry's <hlo>.lock) is missing in the local entry folder
  // `dir`: true while another host holds the entry, so that this host shows the lock file
  // there, as a folder shared by both hosts would. Asked at every lookup of the name.
  virtual bool held_elsewhere(int /*dir*/, std::string_view /*lock_name*/) const { return false; }
  // A client of this host creates the lock file `lock_name` in the local entry folder
  // `dir`, to compile the entry itself: the entry is held elsewhere for it first, within
  // a bound of a few seconds.
  virtual ClientHold hold_for_client(int /*dir*/, std::string_view /*lock_name*/) const { return {}; }
  // A client of this host takes the lock of the LNL key whose folder is `entry_dir` (the
  // folder may not exist yet), to compile the key itself: as hold_for_client. What was
  // taken is given back through publish_written when the client lets go of the lock.
  virtual ClientHold hold_key_for_client(const std::string& /*entry_dir*/) const { return {}; }
  // What hold_key_for_client took for clients of this host that then did not get the
  // key's lock is given back.
  virtual void give_back_key(const std::string& /*entry_dir*/) const {}
  // A reader opened the local NEFF `neff` (it is kept longest).
  virtual void neff_opened(int /*neff*/) const {}
  // True when what clients write into a local entry goes elsewhere too (publish_written).
  virtual bool publishes_writes() const { return false; }
  // A client finished writing inputs into the local entry folder `entry_dir`, or its own
  // compile's result, or let go of its lock: they go where other hosts see them (the HLO
  // and flags up to S3 unless S3 has them; a NEFF done here up to S3 unless S3 has the
  // entry done), and what was held for the client is given back.
  virtual Result<void> publish_written(const std::string& /*entry_dir*/) const { return {}; }
  // A client renames the local folder `folder`, which is no entry, to `to` (LNL's
  // save_cache() publishing an entry to a shared disk): where `to` is an entry's folder,
  // the remote publishes it where other hosts see it first, or says why not. Errc::exists
  // when the entry is there already: the rename must fail as a rename onto a taken name
  // does, and overwrite nothing.
  virtual Result<void> promote(const std::string& /*folder*/, const std::string& /*to*/) const { return {}; }
  // Its own counters for the daemon's stats.json (fetches, uploads...), if any.
  NEFFCACHE_DECL virtual std::optional<nlohmann::ordered_json> counters() const;
};

}  // namespace neffcache::store

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/store/remote.ipp>
#endif
