// CRC-32C (Castagnoli), as TFRecord framing needs it: TensorBoard checks every record's length and data with it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dscpp {

uint32_t crc32c(const void* data, size_t size);

// TFRecord stores CRCs rotated and offset ("masked"), so a CRC of data that itself holds CRCs stays well mixed.
inline uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace dscpp
