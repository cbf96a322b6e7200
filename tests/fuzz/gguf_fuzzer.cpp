// libFuzzer target: any bytes given to the GGUF parser give a value or an error, never a crash
// or a read outside the input.
#include <cstdint>
#include <cstdlib>

#include "formats/gguf_file.h"
#include "model/model_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = inferd::GgufFile::parse("fuzz.gguf", reinterpret_cast<const std::byte*>(data), size);
  if (!file) return 0;
  for (const auto& t : file->tensors()) {
    const auto* begin = reinterpret_cast<const std::byte*>(data);
    if (t.data < begin || t.data + t.num_bytes > begin + size) std::abort();
  }
  auto config = inferd::parse_gguf_config(*file);
  (void)config;
  return 0;
}
