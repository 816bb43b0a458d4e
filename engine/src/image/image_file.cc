#include "engine/image_file.h"

// jpeglib.h needs FILE declared first.
#include <cstdio>
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csetjmp>
#include <cstring>
#include <memory>

#include "engine/untrusted_file.h"

namespace engine {
namespace {

struct FileCloser {
  void operator()(FILE* file) const { std::fclose(file); }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

enum class ImageFormat { kPng, kJpeg };

std::string Quoted(const std::filesystem::path& path) { return "image '" + path.string() + "'"; }

StatusOr<ImageFormat> SniffFormat(FILE* file, const std::filesystem::path& path) {
  unsigned char magic[8] = {};
  const size_t read = std::fread(magic, 1, sizeof(magic), file);
  std::rewind(file);
  if (read == sizeof(magic) && png_sig_cmp(magic, 0, sizeof(magic)) == 0) return ImageFormat::kPng;
  if (read >= 3 && magic[0] == 0xFF && magic[1] == 0xD8 && magic[2] == 0xFF) {
    return ImageFormat::kJpeg;
  }
  return InvalidArgumentError(Quoted(path) + " is " +
                              (read == 0 ? "empty" : "neither a PNG nor a JPEG file"));
}

Status CheckSize(const RgbImage& header, const std::filesystem::path& path) {
  if (header.width <= 0 || header.height <= 0) {
    return InvalidArgumentError(Quoted(path) + " has no pixels");
  }
  if (header.width * header.height > kMaxImagePixels) {
    return InvalidArgumentError(Quoted(path) + " has " + std::to_string(header.width) + "x" +
                                std::to_string(header.height) + " pixels, more than " +
                                std::to_string(kMaxImagePixels) +
                                " (Pillow's decompression-bomb limit)");
  }
  return Status::Ok();
}

// Samples of `channels` per pixel (8-bit, or big-endian 16-bit for greyscale) to RGB as Pillow's
// convert("RGB") makes them: grey repeated, alpha dropped, 16-bit grey clamped to 255.
void RowToRgb(const uint8_t* in, int channels, int bit_depth, int64_t width, uint8_t* out) {
  for (int64_t x = 0; x < width; ++x) {
    if (bit_depth == 16) {
      const int value = (in[x * channels * 2] << 8) | in[x * channels * 2 + 1];
      out[x * 3] = out[x * 3 + 1] = out[x * 3 + 2] =
          static_cast<uint8_t>(value > 255 ? 255 : value);
    } else if (channels <= 2) {
      out[x * 3] = out[x * 3 + 1] = out[x * 3 + 2] = in[x * channels];
    } else {
      std::memcpy(out + x * 3, in + x * channels, 3);
    }
  }
}

// libpng reports errors through a callback that must not return: it records the message and
// jumps back to the setjmp in ReadPng. Everything that must survive the jump lives on the heap.
struct PngRead {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::string error;
  std::vector<uint8_t> row;
  std::vector<png_bytep> rows;
  ~PngRead() { png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr); }
};

void PngError(png_structp png, png_const_charp message) {
  static_cast<PngRead*>(png_get_error_ptr(png))->error = message;
  png_longjmp(png, 1);
}
void PngWarning(png_structp /*png*/, png_const_charp /*message*/) {}

std::string PngMode(int color_type, int bit_depth) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      return bit_depth == 1 ? "1" : bit_depth == 16 ? "I;16" : "L";
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return "LA";
    case PNG_COLOR_TYPE_PALETTE:
      return "P";
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return "RGBA";
    default:
      return "RGB";
  }
}

Status ReadPng(FILE* file, const std::filesystem::path& path, RgbImage* image) {
  auto read = std::make_unique<PngRead>();
  read->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, read.get(), PngError, PngWarning);
  if (read->png == nullptr || (read->info = png_create_info_struct(read->png)) == nullptr) {
    return InternalError(Quoted(path) + ": cannot start libpng");
  }
  if (setjmp(png_jmpbuf(read->png))) {
    return InvalidArgumentError(Quoted(path) + " is not a readable PNG file: " + read->error);
  }
  png_init_io(read->png, file);
  png_read_info(read->png, read->info);
  const int color_type = png_get_color_type(read->png, read->info);
  const int bit_depth = png_get_bit_depth(read->png, read->info);
  image->width = png_get_image_width(read->png, read->info);
  image->height = png_get_image_height(read->png, read->info);
  image->source_mode = PngMode(color_type, bit_depth);
  ENGINE_RETURN_IF_ERROR(CheckSize(*image, path));

  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(read->png);
  if (bit_depth < 8) png_set_expand_gray_1_2_4_to_8(read->png);
  // Pillow keeps 16-bit grey as "I;16" and clamps it; other 16-bit modes keep the high byte.
  const bool grey16 = color_type == PNG_COLOR_TYPE_GRAY && bit_depth == 16;
  if (bit_depth == 16 && !grey16) png_set_strip_16(read->png);
  const int passes = png_set_interlace_handling(read->png);
  png_read_update_info(read->png, read->info);
  const int channels = png_get_channels(read->png, read->info);
  const int depth = png_get_bit_depth(read->png, read->info);
  const size_t row_bytes = png_get_rowbytes(read->png, read->info);
  const auto width = image->width;
  image->pixels.assign(static_cast<size_t>(width * image->height * 3), 0);
  if (passes == 1) {
    read->row.resize(row_bytes);
    for (int64_t y = 0; y < image->height; ++y) {
      png_read_row(read->png, read->row.data(), nullptr);
      RowToRgb(read->row.data(), channels, depth, width, image->pixels.data() + y * width * 3);
    }
  } else {
    // Interlaced images arrive in passes over the whole image.
    read->row.resize(row_bytes * static_cast<size_t>(image->height));
    read->rows.resize(static_cast<size_t>(image->height));
    for (size_t y = 0; y < read->rows.size(); ++y) read->rows[y] = read->row.data() + y * row_bytes;
    png_read_image(read->png, read->rows.data());
    for (int64_t y = 0; y < image->height; ++y) {
      RowToRgb(read->rows[static_cast<size_t>(y)], channels, depth, width,
               image->pixels.data() + y * width * 3);
    }
  }
  return Status::Ok();
}

// libjpeg's error manager, extended with where to jump and what it said. Pillow ignores libjpeg's
// warnings except running out of data, which it reports as a truncated file; so do we.
struct JpegErrors {
  jpeg_error_mgr manager;
  jmp_buf jump;
  std::string message;
  std::string truncated;
};

void JpegErrorExit(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  char text[JMSG_LENGTH_MAX];
  (*info->err->format_message)(info, text);
  errors->message = text;
  std::longjmp(errors->jump, 1);
}

void JpegMessage(j_common_ptr info, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  if (level < 0 && info->err->msg_code == JWRN_JPEG_EOF && errors->truncated.empty()) {
    char text[JMSG_LENGTH_MAX];
    (*info->err->format_message)(info, text);
    errors->truncated = text;
  }
}

struct JpegRead {
  jpeg_decompress_struct info;
  JpegErrors errors;
  bool created = false;
  ~JpegRead() {
    if (created) jpeg_destroy_decompress(&info);
  }
};

Status ReadJpeg(FILE* file, const std::filesystem::path& path, RgbImage* image) {
  auto read = std::make_unique<JpegRead>();
  read->info.err = jpeg_std_error(&read->errors.manager);
  read->errors.manager.error_exit = JpegErrorExit;
  read->errors.manager.emit_message = JpegMessage;
  if (setjmp(read->errors.jump)) {
    return InvalidArgumentError(Quoted(path) +
                                " is not a readable JPEG file: " + read->errors.message);
  }
  jpeg_create_decompress(&read->info);
  read->created = true;
  jpeg_stdio_src(&read->info, file);
  jpeg_read_header(&read->info, TRUE);
  image->width = read->info.image_width;
  image->height = read->info.image_height;
  const J_COLOR_SPACE space = read->info.jpeg_color_space;
  if (space == JCS_CMYK || space == JCS_YCCK) {
    return InvalidArgumentError(Quoted(path) +
                                " is a CMYK JPEG; this engine reads greyscale and colour (YCbCr, "
                                "RGB) JPEGs: convert it to RGB");
  }
  image->source_mode = space == JCS_GRAYSCALE ? "L" : "RGB";
  ENGINE_RETURN_IF_ERROR(CheckSize(*image, path));

  read->info.out_color_space = JCS_RGB;
  jpeg_start_decompress(&read->info);
  const auto width = image->width;
  image->pixels.assign(static_cast<size_t>(width * image->height * 3), 0);
  while (read->info.output_scanline < read->info.output_height) {
    JSAMPROW row =
        image->pixels.data() + static_cast<int64_t>(read->info.output_scanline) * width * 3;
    jpeg_read_scanlines(&read->info, &row, 1);
  }
  jpeg_finish_decompress(&read->info);
  if (!read->errors.truncated.empty()) {
    return InvalidArgumentError(Quoted(path) + " is truncated: " + read->errors.truncated);
  }
  return Status::Ok();
}

StatusOr<RgbImage> DecodeImageFile(FILE* file, const std::filesystem::path& path) {
  ENGINE_ASSIGN_OR_RETURN(ImageFormat format, SniffFormat(file, path));
  RgbImage image;
  ENGINE_RETURN_IF_ERROR(format == ImageFormat::kPng ? ReadPng(file, path, &image)
                                                     : ReadJpeg(file, path, &image));
  return image;
}

}  // namespace

StatusOr<RgbImage> ReadRgbImage(const std::filesystem::path& path) {
  ENGINE_ASSIGN_OR_RETURN(const int fd, OpenUntrustedFile(path, FileKind::kImage));
  FilePtr file(fdopen(fd, "rb"));
  if (file == nullptr) {
    const int err = errno;
    ::close(fd);
    return IoError(Quoted(path) + " cannot be read: " + std::strerror(err));
  }
  return DecodeImageFile(file.get(), path);
}

StatusOr<RgbImage> DecodeRgbImage(const std::string& bytes, const std::filesystem::path& path) {
  if (bytes.empty()) return InvalidArgumentError(Quoted(path) + " is empty");
  // The decoders read through stdio; fmemopen gives them the bytes in memory as a file.
  FilePtr file(fmemopen(const_cast<char*>(bytes.data()), bytes.size(), "rb"));
  if (file == nullptr) return InternalError(Quoted(path) + ": " + std::strerror(errno));
  return DecodeImageFile(file.get(), path);
}

bool IsImageFileName(const std::filesystem::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".png" || extension == ".jpg" || extension == ".jpeg";
}

StatusOr<std::vector<std::filesystem::path>> FrameFilesOf(const std::filesystem::path& dir,
                                                          int64_t most) {
  std::vector<std::filesystem::path> frames;
  std::error_code error;
  // Other files are skipped, but not without bound: a directory of millions of entries is refused
  // rather than walked.
  int64_t entries = 0;
  const int64_t most_entries = 2 * most + 1000;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    if (++entries > most_entries) {
      return InvalidArgumentError(Quoted(dir) + " holds more than " + std::to_string(most_entries) +
                                  " entries, too many to look "
                                  "through for the frames of one video");
    }
    if (!IsImageFileName(it->path())) continue;
    if (static_cast<int64_t>(frames.size()) >= most) {
      return InvalidArgumentError(Quoted(dir) + " holds more than " + std::to_string(most) +
                                  " frames, the most this engine reads of one video");
    }
    frames.push_back(it->path());
  }
  if (error) return IoError(Quoted(dir) + " cannot be listed: " + error.message());
  if (frames.empty()) {
    return InvalidArgumentError(Quoted(dir) +
                                " is a directory without image files (.png, .jpg, .jpeg)");
  }
  std::sort(frames.begin(), frames.end());
  return frames;
}

}  // namespace engine
