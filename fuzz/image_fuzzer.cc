// libFuzzer target: an image file's bytes (image/image_file.cc: PNG with libpng, JPEG with
// libjpeg-turbo), decoded to RGB as the chat data loader and `engine generate --image` decode them.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/image_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  engine::DecodeRgbImage(bytes, "fuzz.png").status().IgnoreError();
  return 0;
}
