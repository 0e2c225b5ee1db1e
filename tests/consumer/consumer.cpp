// Prints the graph hash of an HLO file and the flags hash of ["--target=trn1"].
#include <cstdio>

#include <neffcache/neffcache.hpp>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto r = neffcache::analyze_hlo_file(argv[1]);
  if (!r) {
    std::fprintf(stderr, "%s\n", r.error().message.c_str());
    return 1;
  }
  std::printf("%s %s\n", r->graph_hash.c_str(), neffcache::flags_hash({"--target=trn1"}).c_str());
  return 0;
}
