// PNG and JPEG files read into 8-bit RGB pixels, as Pillow's Image.open(...).convert("RGB") gives
// them (what transformers' image processors see), with libpng and libjpeg-turbo.
//
//   ENGINE_ASSIGN_OR_RETURN(RgbImage image, ReadRgbImage(path));
//   ENGINE_ASSIGN_OR_RETURN(RgbImage image, DecodeRgbImage(bytes, path));  // bytes read already
//
// Conversions are Pillow's: greyscale is repeated into the three channels, a palette is looked
// up, alpha (an alpha channel or a PNG's tRNS transparency) is dropped, not composited, and 16-bit
// PNG samples keep their high byte. `source_mode` says what the file held ("RGB", "L", "RGBA",
// "LA", "P"), so callers can report the conversions.
//
// Failure: a missing file, one that is neither PNG nor JPEG, a corrupt or truncated one (libjpeg's
// "premature end of data" too, which Pillow also refuses), a CMYK JPEG, an empty image, or one of
// more than kMaxImagePixels pixels (Pillow's decompression-bomb limit) is an error naming the file
// and what is wrong. Nothing is printed. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/status.h"

namespace engine {

// Pillow refuses images above twice its MAX_IMAGE_PIXELS (89,478,485).
inline constexpr int64_t kMaxImagePixels = 178956970;

struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::string source_mode;      // Pillow's name for what the file holds: "RGB", "L", "RGBA", ...
  std::vector<uint8_t> pixels;  // height x width x 3, row by row
};

StatusOr<RgbImage> ReadRgbImage(const std::filesystem::path& path);
// The same for a file's bytes; `path` names it in errors.
StatusOr<RgbImage> DecodeRgbImage(const std::string& bytes, const std::filesystem::path& path);

// Whether `path` names a PNG or JPEG file, by its extension (any case).
bool IsImageFileName(const std::filesystem::path& path);
// A video given as a directory of frames: its PNG and JPEG files (by name) in name order. An error
// naming the directory when it cannot be listed, holds none, or holds more than `most`.
StatusOr<std::vector<std::filesystem::path>> FrameFilesOf(const std::filesystem::path& dir,
                                                          int64_t most);

// Whether a file of this mode loses something on the way to RGB (alpha) or gains channels
// (greyscale), for the plan's account of conversions.
inline bool ConvertedToRgb(const std::string& source_mode) { return source_mode != "RGB"; }

}  // namespace engine
