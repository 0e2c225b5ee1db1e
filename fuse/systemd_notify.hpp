// How neffcachefs tells systemd that it is ready or stopping (its units are Type=notify).
#pragma once

#include <string>

namespace neffcachefs {

// Sends STATE ("READY=1\n...", "STOPPING=1") to systemd through libsystemd's sd_notify;
// nothing when the daemon was not started by systemd (no NOTIFY_SOCKET). libsystemd is
// loaded then, and only then, so that the daemon runs where it is missing (a minimal
// container image): it is no dependency of the programs (docs/INSTALL.md).
void notify_systemd(const std::string& state);

}  // namespace neffcachefs
