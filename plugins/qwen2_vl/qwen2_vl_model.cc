// The `qwen2_vl` model loader: Qwen2-VL, as qwen2_vl_loader.h reads it.
#include "qwen2_vl_loader.h"

namespace engine::transformer {
namespace {

class Qwen2VlLoader : public Qwen2VlFamilyLoader {
 public:
  Qwen2VlLoader() : Qwen2VlFamilyLoader("qwen2_vl") {}
};

}  // namespace
}  // namespace engine::transformer

ENGINE_PLUGIN("qwen2_vl", ENGINE_KIND_MODEL_LOADER, "0.1.0",
              "Qwen2-VL (Qwen2VLForConditionalGeneration: vision tower visual.*, Qwen2 decoder "
              "model.*, lm_head.*) from a Hugging Face directory or a config.json",
              engine::transformer::Qwen2VlLoader)
