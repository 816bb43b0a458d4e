#include "image/image_resize.h"

#include <algorithm>
#include <cmath>

namespace engine {
namespace {

// Pillow's fixed point: 8 bits of result and 2 of headroom for the filter's negative lobes.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kSupport = 2.0;

double Cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// For each output pixel: the first input pixel it reads, how many, and their fixed-point weights.
struct Taps {
  int64_t size = 0;  // weights per output pixel
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;
};

Taps ComputeTaps(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = kSupport * filter_scale;
  const double inverse_filter_scale = 1.0 / filter_scale;
  Taps taps;
  taps.size = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(out_size * taps.size, 0);
  std::vector<double> w(taps.size);
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    const int64_t first = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t end = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    const int64_t count = end - first;
    double total = 0;
    for (int64_t i = 0; i < count; ++i) {
      w[i] = Cubic((i + first - center + 0.5) * inverse_filter_scale);
      total += w[i];
    }
    for (int64_t i = 0; i < count; ++i) {
      const double normalized = total != 0.0 ? w[i] / total : w[i];
      const double fixed = normalized * (1 << kPrecisionBits);
      taps.weights[o * taps.size + i] = static_cast<int32_t>(fixed < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    taps.first[o] = first;
    taps.count[o] = count;
  }
  return taps;
}

uint8_t Clip8(int32_t sum) {
  return static_cast<uint8_t>(std::clamp(sum >> kPrecisionBits, 0, 255));
}

// Resamples `lines` lines of pixels `in_step` bytes apart (lines `in_line_stride` apart): along x
// the lines are rows and the step a pixel, along y the lines are columns and the step a row.
void Pass(const uint8_t* in, uint8_t* out, const Taps& taps, int64_t out_size, int64_t lines,
          int64_t in_line_stride, int64_t in_step, int64_t out_line_stride, int64_t out_step) {
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t o = 0; o < out_size; ++o) {
      const int32_t* w = &taps.weights[o * taps.size];
      const uint8_t* src = in + line * in_line_stride + taps.first[o] * in_step;
      for (int c = 0; c < 3; ++c) {
        int32_t sum = 1 << (kPrecisionBits - 1);
        for (int64_t i = 0; i < taps.count[o]; ++i) sum += src[i * in_step + c] * w[i];
        out[line * out_line_stride + o * out_step + c] = Clip8(sum);
      }
    }
  }
}

}  // namespace

std::vector<uint8_t> ResizeBicubicLikePillow(const std::vector<uint8_t>& rgb, int64_t width,
                                             int64_t height, int64_t out_width,
                                             int64_t out_height) {
  // What the vertical pass reads: the input, or the horizontal pass's rows.
  const std::vector<uint8_t>* current = &rgb;
  std::vector<uint8_t> horizontal_rows;
  int64_t current_width = width;
  // Pillow resizes horizontally first, over only the rows the vertical pass will read.
  const Taps vertical = ComputeTaps(height, out_height);
  const int64_t first_row = vertical.first.front();
  const int64_t last_row = vertical.first.back() + vertical.count.back();
  const bool horizontal_pass = out_width != width;
  const bool vertical_pass = out_height != height;
  int64_t row_offset = 0;
  if (horizontal_pass) {
    const Taps horizontal = ComputeTaps(width, out_width);
    const int64_t rows = last_row - first_row;
    horizontal_rows.resize(rows * out_width * 3);
    Pass(rgb.data() + first_row * width * 3, horizontal_rows.data(), horizontal, out_width, rows,
         width * 3, 3, out_width * 3, 3);
    current = &horizontal_rows;
    current_width = out_width;
    row_offset = first_row;
  }
  if (!vertical_pass) return *current;
  // Column by column: a "line" is a column (step 3 between them), pixels are rows apart.
  std::vector<uint8_t> out(out_height * current_width * 3);
  Taps shifted = vertical;
  for (int64_t& first : shifted.first) first -= row_offset;
  Pass(current->data(), out.data(), shifted, out_height, current_width, 3, current_width * 3, 3,
       current_width * 3);
  return out;
}

}  // namespace engine
