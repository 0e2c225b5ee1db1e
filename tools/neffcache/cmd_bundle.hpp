#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct BundleOptions {
  std::string cache;     // empty: the Neuron precedence
  std::string manifest;  // create: the entries to bundle
  std::string bundle;    // create: the file written; import: the file read
};

void setup_bundle(CLI::App& app, int& exit_code);
int run_bundle_create(const BundleOptions& opts);
int run_bundle_import(const BundleOptions& opts);

}  // namespace neffcache::cli
