// libFuzzer target: the safetensors parser on arbitrary bytes.
#include <cstdint>
#include <cstdlib>

#include "formats/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file =
      inferd::SafetensorsFile::parse("fuzz.safetensors", reinterpret_cast<const std::byte*>(data), size);
  if (!file) return 0;
  for (const auto& t : file->tensors()) {
    const auto* begin = reinterpret_cast<const std::byte*>(data);
    if (t.data < begin || t.data + t.num_bytes > begin + size) std::abort();
  }
  return 0;
}
