// The `qwen2_5_vl` model loader: Qwen2.5-VL, as qwen2_vl_loader.h reads it.
#include "qwen2_vl_loader.h"

namespace engine::transformer {
namespace {

class Qwen25VlLoader : public Qwen2VlFamilyLoader {
 public:
  Qwen25VlLoader() : Qwen2VlFamilyLoader("qwen2_5_vl") {}
};

}  // namespace
}  // namespace engine::transformer

ENGINE_PLUGIN("qwen2_5_vl", ENGINE_KIND_MODEL_LOADER, "0.1.0",
              "Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration: windowed vision tower visual.*, "
              "Qwen2 decoder model.*, lm_head.*) from a Hugging Face directory or a config.json",
              engine::transformer::Qwen25VlLoader)
