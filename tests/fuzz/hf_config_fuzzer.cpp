// libFuzzer target: Hugging Face config.json parsing on arbitrary text.
#include <cstdint>
#include <string>

#include "model/model_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config =
      inferd::parse_hf_config("config.json", std::string(reinterpret_cast<const char*>(data), size));
  (void)config;
  return 0;
}
