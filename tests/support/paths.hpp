// Where this build's programs and the tests' data are. The values are defined in one source
// file that CMake generates per build folder (tests/CMakeLists.txt), not passed as compile
// definitions: an absolute path on the command line of every test unit would make each clone
// of the repository compile them anew instead of reusing what ccache stored for another.
#pragma once

namespace test::path {

extern const char* const corpus;         // tests/corpus, or NEFFCACHE_CORPUS_DIR
extern const char* const data;           // tests/data
extern const char* const fuzz;           // fuzz/ (seeds and inputs the fuzzers found)
extern const char* const s3_scripts;     // tests/s3 (radosgw.sh, the proxy and IMDS stand-ins)
extern const char* const s3_dir;         // the folder of the radosgw that ctest starts (s3.env)
extern const char* const tool;           // neffcache
extern const char* const npc;            // neuron_parallel_compile
extern const char* const client_sim;     // neuron-client-sim
extern const char* const fake_compiler;  // fake-neuronx-cc
extern const char* const daemon;         // neffcachefs
extern const char* const shim_dir;       // the folder whose neuronx-cc is neffcache-cc
extern const char* const lock_helper;    // tests/support/lock_helper.cpp
extern const char* const reader;         // tests/support/fuse_reader.cpp
extern const char* const lnl_client;     // tests/support/lnl_client.py: an LNL rank written from the facts
extern const char* const neuron_client;  // tests/conformance/neuron_client.py: a torch-xla rank, likewise
extern const char* const docs;           // docs/
extern const char* const promtool;       // Prometheus' checker (scripts/setup.sh unpacks it)

}  // namespace test::path
