// How neffcachefs tells systemd that it is ready or stopping (its units are Type=notify).
#pragma once

#include <string>

namespace neffcachefs {

// Loads libsystemd's sd_notify when systemd started the daemon (NOTIFY_SOCKET is set), and only
// then: libsystemd is no dependency of the programs, so that the daemon runs where it is missing
// (a minimal container image; docs/INSTALL.md). Called once at start-up, before any thread.
// Returns the reason when NOTIFY_SOCKET is set and the library cannot be loaded: the unit would
// wait for READY=1 until its start timed out. Empty otherwise.
std::string prepare_systemd_notify();

// Sends STATE ("READY=1\n...", "STOPPING=1") to systemd; nothing when the daemon was not started
// by systemd.
void notify_systemd(const std::string& state);

}  // namespace neffcachefs
