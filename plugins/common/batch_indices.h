// The index check every in-memory dataset's GetBatch makes, with one message for all of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data.h"

namespace engine::plugins {

// Fails when an index lies outside [0, size); `unit` names the examples ("images", "windows").
inline Status CheckBatchIndices(Split split, const std::vector<int64_t>& indices, int64_t size,
                                const char* unit) {
  for (int64_t i : indices) {
    if (i < 0 || i >= size) {
      return InvalidArgumentError("example " + std::to_string(i) + " is outside the " +
                                  std::string(SplitName(split)) + " split (" +
                                  std::to_string(size) + " " + unit + ")");
    }
  }
  return Status::Ok();
}

}  // namespace engine::plugins
