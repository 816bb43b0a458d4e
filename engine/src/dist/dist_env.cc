#include "dist/dist_env.h"

#include <cstdlib>

namespace engine {
namespace {

StatusOr<int> IntegerVariable(const char* name, int fallback, int min, int max) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < min || value > max) {
    return InvalidArgumentError(std::string(name) + "='" + text + "' is not an integer in [" +
                                std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return static_cast<int>(value);
}

}  // namespace

StatusOr<DistEnv> ReadDistEnv() {
  DistEnv env;
  const char* world = std::getenv("WORLD_SIZE");
  env.from_environment = world != nullptr && *world != '\0';
  ENGINE_ASSIGN_OR_RETURN(env.world_size, IntegerVariable("WORLD_SIZE", 1, 1, 1 << 20));
  ENGINE_ASSIGN_OR_RETURN(env.rank, IntegerVariable("RANK", 0, 0, 1 << 20));
  ENGINE_ASSIGN_OR_RETURN(env.local_rank, IntegerVariable("LOCAL_RANK", env.rank, 0, 1 << 20));
  ENGINE_ASSIGN_OR_RETURN(env.local_world_size,
                          IntegerVariable("LOCAL_WORLD_SIZE", env.world_size, 1, 1 << 20));
  ENGINE_ASSIGN_OR_RETURN(env.master_port, IntegerVariable("MASTER_PORT", 29500, 1, 65535));
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    env.master_addr = addr;
  }
  if (env.rank >= env.world_size) {
    return InvalidArgumentError("RANK=" + std::to_string(env.rank) +
                                " is not below WORLD_SIZE=" + std::to_string(env.world_size));
  }
  return env;
}

}  // namespace engine
