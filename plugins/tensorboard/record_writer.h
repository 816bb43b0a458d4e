// TensorBoard's record framing (TFRecord): for each record, its length (u64, little endian), the
// masked CRC32C of those 8 bytes, the data, and the masked CRC32C of the data. The mask is
// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace engine::plugins::tensorboard {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78).
uint32_t Crc32c(const void* data, size_t size);
uint32_t MaskCrc(uint32_t crc);

// The framed record for `data`.
std::string FrameRecord(std::string_view data);

}  // namespace engine::plugins::tensorboard
