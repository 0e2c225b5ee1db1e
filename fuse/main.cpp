// neffcachefs [OPTIONS] BACKING MOUNTPOINT: mounts a Neuron compile cache so that opening a
// missing model.neff compiles it (daemon.cpp).
#include "daemon.hpp"

int main(int argc, char** argv) { return neffcachefs::run_daemon(argc, argv); }
