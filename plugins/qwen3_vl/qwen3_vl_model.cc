// The `qwen3_vl` model loader: Qwen3-VL (dense), as qwen2_vl_loader.h reads it.
#include "qwen2_vl_loader.h"

namespace engine::transformer {
namespace {

class Qwen3VlLoader : public Qwen2VlFamilyLoader {
 public:
  Qwen3VlLoader() : Qwen2VlFamilyLoader("qwen3_vl") {}
};

}  // namespace
}  // namespace engine::transformer

ENGINE_PLUGIN("qwen3_vl", ENGINE_KIND_MODEL_LOADER, "0.1.0",
              "Qwen3-VL, dense (Qwen3VLForConditionalGeneration: vision tower with learned "
              "positions and DeepStack mergers model.visual.*, Qwen3 decoder with interleaved "
              "M-RoPE model.language_model.*, lm_head.*) from a Hugging Face directory or a "
              "config.json",
              engine::transformer::Qwen3VlLoader)
