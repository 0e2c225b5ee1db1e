// libFuzzer entry point; the target itself is in targets.hpp.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  neffcache::fuzz::s3_answer(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
