#include "qwen2_vl_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "qwen2_5_vl_vision.h"
#include "qwen2_vl_positions.h"
#include "qwen3_vl_vision.h"

namespace engine::transformer {
namespace {

const char* const kVisionTokenKeys[] = {"image_token_id", "video_token_id", "vision_start_token_id",
                                        "vision_end_token_id"};

// Top-level keys of a qwen3_vl config.json beside text_config and vision_config: what
// Qwen3VLConfig reads there, and bookkeeping.
const std::set<std::string>& Qwen3VlTopLevelKeys() {
  static const std::set<std::string> keys = {
      "architectures",         "model_type",           "image_token_id",      "video_token_id",
      "vision_start_token_id", "vision_end_token_id",  "tie_word_embeddings", "dtype",
      "torch_dtype",           "transformers_version", "_name_or_path",       "use_cache"};
  return keys;
}

// transformers 5 writes the language model's keys under text_config (model_type qwen2_vl_text,
// qwen2_5_vl_text, qwen3_vl_text); they are read as transformers 4's flat layout, where a key
// given in both places must agree. Qwen3-VL has no flat layout: its decoder is read from
// text_config alone, and a decoder key at the top level (which Qwen3VLConfig does not read) is
// refused by name.
StatusOr<nlohmann::json> FlatConfig(const nlohmann::json& json, const std::string& where) {
  auto text = json.find("text_config");
  if (json.value("model_type", nlohmann::json()) == "qwen3_vl") {
    if (text == json.end()) {
      return InvalidArgumentError(where +
                                  ": 'text_config' is missing (transformers' "
                                  "Qwen3VLConfig reads the decoder only from it)");
    }
    for (const auto& [key, value] : json.items()) {
      if (key != "text_config" && key != "vision_config" && !Qwen3VlTopLevelKeys().count(key)) {
        return InvalidArgumentError(where + ": '" + key +
                                    "' is at the top level, where transformers' Qwen3VLConfig "
                                    "does not read it (the decoder's keys belong in text_config)");
      }
    }
  }
  if (text == json.end()) return json;
  if (!text->is_object()) {
    return InvalidArgumentError(where + ": 'text_config' must be an object, not " + text->dump());
  }
  nlohmann::json flat = json;
  flat.erase("text_config");
  const std::string family = json.value("model_type", "");
  for (const auto& [key, value] : text->items()) {
    // transformers' Qwen3-VL ties its head as the top-level key says, whatever text_config says.
    if (family == "qwen3_vl" && key == "tie_word_embeddings") continue;
    if (key == "model_type") {
      if (value != family + "_text" && value != family) {
        return InvalidArgumentError(where + ": text_config.model_type is " + value.dump() +
                                    ", not the text config of " + family + " (" + family +
                                    "_text)");
      }
      continue;
    }
    if (flat.contains(key) && flat[key] != value && key != "architectures" &&
        key != "torch_dtype" && key != "dtype" && key != "transformers_version") {
      return InvalidArgumentError(where + ": '" + key + "' is " + flat[key].dump() +
                                  " but text_config." + key + " is " + value.dump());
    }
    flat[key] = value;
  }
  return flat;
}

}  // namespace

const PrefixRenames& Qwen2VlTransformers5Names() {
  static const PrefixRenames renames = {{"model.language_model.", "model."},
                                        {"model.visual.", "visual."}};
  return renames;
}

const PrefixRenames& Qwen2VlCheckpointRenames(const Qwen2VlConfig& config) {
  static const PrefixRenames none;
  return config.vision.family == VisionFamily::kQwen3Vl ? none : Qwen2VlTransformers5Names();
}

nlohmann::json Qwen2VlConfig::ToJson(const std::string& dtype) const {
  nlohmann::json json = text.ToJson(dtype);
  if (vision.family == VisionFamily::kQwen3Vl) {
    // transformers' Qwen3VLConfig reads the decoder only from text_config, and its rotary
    // settings only from rope_parameters.
    nlohmann::json text_config = json;
    for (const char* top : {"architectures", "torch_dtype", "tie_word_embeddings"}) {
      text_config.erase(top);
    }
    text_config["model_type"] = "qwen3_vl_text";
    nlohmann::json rope = text_config["rope_scaling"];
    rope["rope_theta"] = text_config["rope_theta"];
    text_config.erase("rope_scaling");
    text_config.erase("rope_theta");
    text_config["rope_parameters"] = rope;
    text_config["head_dim"] = text.head_dim();
    json = {{"architectures", json["architectures"]},
            {"dtype", dtype},
            {"tie_word_embeddings", text.tie_word_embeddings},
            {"text_config", text_config}};
  }
  json["model_type"] = model_type();
  json["vision_config"] = vision.ToJson();
  json["image_token_id"] = image_token_id;
  json["video_token_id"] = video_token_id;
  json["vision_start_token_id"] = vision_start_token_id;
  json["vision_end_token_id"] = vision_end_token_id;
  return json;
}

StatusOr<Qwen2VlConfig> Qwen2VlConfigFromJson(const nlohmann::json& given,
                                              const std::string& where) {
  ENGINE_ASSIGN_OR_RETURN(const nlohmann::json json, FlatConfig(given, where));
  Qwen2VlConfig c;
  ENGINE_ASSIGN_OR_RETURN(c.text, Qwen2VlTextConfigFromJson(json, where));
  if (!json.contains("vision_config")) {
    return InvalidArgumentError(where + ": 'vision_config' is missing");
  }
  const std::string vision_where = where + " vision_config";
  ENGINE_ASSIGN_OR_RETURN(c.vision,
                          c.model_type() == "qwen2_5_vl"
                              ? Qwen25VlVisionConfigFromJson(json["vision_config"], vision_where)
                          : c.model_type() == "qwen3_vl"
                              ? Qwen3VlVisionConfigFromJson(json["vision_config"], vision_where)
                              : Qwen2VlVisionConfigFromJson(json["vision_config"], vision_where));
  int64_t* ids[] = {&c.image_token_id, &c.video_token_id, &c.vision_start_token_id,
                    &c.vision_end_token_id};
  for (size_t i = 0; i < std::size(kVisionTokenKeys); ++i) {
    auto it = json.find(kVisionTokenKeys[i]);
    if (it == json.end()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() >= c.text.vocab_size) {
      return InvalidArgumentError(where + ": '" + kVisionTokenKeys[i] +
                                  "' must be a token id below vocab_size " +
                                  std::to_string(c.text.vocab_size) + ", not " + it->dump());
    }
    *ids[i] = it->get<int64_t>();
  }
  if (c.vision.hidden_size != c.text.hidden_size) {
    return InvalidArgumentError(
        where + ": vision_config." +
        (c.model_type() == "qwen2_vl" ? "hidden_size " : "out_hidden_size ") +
        std::to_string(c.vision.hidden_size) +
        " (the merger's output) is not the decoder's hidden_size " +
        std::to_string(c.text.hidden_size));
  }
  const auto deepstack = static_cast<int64_t>(c.vision.deepstack_visual_indexes.size());
  if (deepstack > c.text.num_hidden_layers) {
    // transformers would drop the features past the last layer.
    return InvalidArgumentError(
        where + ": vision_config.deepstack_visual_indexes feeds " + std::to_string(deepstack) +
        " decoder layers, but the decoder has " + std::to_string(c.text.num_hidden_layers));
  }
  return c;
}

Qwen2VlModule::Qwen2VlModule(const Qwen2VlConfig& config)
    : lm(PartsOwner(config),
         config.vision.family == VisionFamily::kQwen3Vl ? "language_model" : "model", *this,
         config.text),
      config_(config) {
  std::shared_ptr<QwenVisionTower> tower;
  switch (config.vision.family) {
    case VisionFamily::kQwen2Vl:
      tower = Qwen2VlVisionTower(config.vision).ptr();
      break;
    case VisionFamily::kQwen25Vl:
      tower = Qwen25VlVisionTower(config.vision).ptr();
      break;
    case VisionFamily::kQwen3Vl:
      tower = Qwen3VlVisionTower(config.vision).ptr();
      break;
  }
  visual = PartsOwner(config).register_module("visual", tower);
}

torch::nn::Module& Qwen2VlModule::PartsOwner(const Qwen2VlConfig& config) {
  if (config.vision.family != VisionFamily::kQwen3Vl) return *this;
  // Called twice while constructing: the first call registers "model". named_children() is a
  // copy, kept alive while it is searched; the module it finds is also held by this one.
  const auto children = named_children();
  if (const auto* found = children.find("model")) return **found;
  return *register_module("model", std::make_shared<torch::nn::Module>());
}

StatusOr<at::Tensor> Qwen2VlModule::Hidden(
    const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& pixel_values,
    const std::vector<std::vector<ImageGrid>>& row_grids, bool checkpointing, KvCache* cache,
    std::vector<int64_t>* next_positions, at::Tensor* position_ids) {
  ImagesOfBatch images;
  images.pixel_values = pixel_values;
  images.row_grids = row_grids;
  return Hidden(input_ids, attention_mask, images, ImagesOfBatch(), checkpointing, cache,
                next_positions, position_ids);
}

namespace {

// Each row's images and videos, with each video's temporal step: 1, or Qwen2.5-VL's
// tokens_per_second times its whole seconds per temporal patch (transformers 5 truncates them).
// Qwen3-VL's text puts each temporal patch of a video in its own vision tokens after its
// timestamp: one run of tokens, and positions, per temporal patch.
std::vector<RowVisuals> RowsOf(const ImagesOfBatch& images, const ImagesOfBatch& videos,
                               const Qwen2VlVisionConfig& vision) {
  std::vector<RowVisuals> rows(std::max(images.row_grids.size(), videos.row_grids.size()));
  for (size_t r = 0; r < images.row_grids.size(); ++r) rows[r].images = images.row_grids[r];
  for (size_t r = 0; r < videos.row_grids.size(); ++r) {
    if (vision.family == VisionFamily::kQwen3Vl) {
      for (const ImageGrid& g : videos.row_grids[r]) {
        rows[r].videos.insert(rows[r].videos.end(), g.t, ImageGrid{1, g.h, g.w});
      }
      continue;
    }
    rows[r].videos = videos.row_grids[r];
    for (size_t v = 0; v < videos.row_grids[r].size(); ++v) {
      const double seconds =
          r < videos.row_seconds_per_grid.size() && v < videos.row_seconds_per_grid[r].size()
              ? videos.row_seconds_per_grid[r][v]
              : 1.0;
      rows[r].video_time_steps.push_back(vision.family == VisionFamily::kQwen25Vl
                                             ? vision.tokens_per_second *
                                                   static_cast<int64_t>(std::trunc(seconds))
                                             : 1);
    }
  }
  return rows;
}

// All grids of a batch, in row order.
std::vector<ImageGrid> AllGrids(const ImagesOfBatch& visuals) {
  std::vector<ImageGrid> grids;
  for (const auto& row : visuals.row_grids) grids.insert(grids.end(), row.begin(), row.end());
  return grids;
}

}  // namespace

StatusOr<Qwen2VlModule::PlacedVisuals> Qwen2VlModule::Place(
    const at::Tensor& host_ids, const at::Tensor& ids, const ImagesOfBatch& visuals,
    int64_t token_id, const VisualFields& fields, bool checkpointing, at::Tensor* embeds) {
  PlacedVisuals placed;
  const std::vector<ImageGrid> grids = AllGrids(visuals);
  const int64_t merge = config_.vision.spatial_merge_size;
  int64_t expected_tokens = 0, patches = 0;
  for (const ImageGrid& g : grids) {
    expected_tokens += g.patches() / (merge * merge);
    patches += g.patches();
  }
  const int64_t* host_id = host_ids.data_ptr<int64_t>();
  const int64_t found_tokens = std::count(host_id, host_id + host_ids.numel(), token_id);
  const std::string name = fields.noun;
  if (found_tokens != expected_tokens) {
    return InvalidArgumentError("the batch has " + std::to_string(found_tokens) + " " + name +
                                " tokens but its " + std::to_string(grids.size()) + " " + name +
                                "(s) give " + std::to_string(expected_tokens));
  }
  if (grids.empty()) return placed;
  const at::Tensor& pixel_values = visuals.pixel_values;
  if (!pixel_values.defined() || pixel_values.dim() != 2 || pixel_values.size(0) != patches ||
      pixel_values.size(1) != config_.vision.patch_values()) {
    return InvalidArgumentError(
        std::string(fields.pixels) + " must be [" + std::to_string(patches) + ", " +
        std::to_string(config_.vision.patch_values()) + "] for the batch's " + name + "s, not " +
        (pixel_values.defined() ? c10::str(pixel_values.sizes()) : std::string("absent")));
  }
  const VisionTokens features = visual->Features(pixel_values, grids, checkpointing);
  placed.deepstack = features.deepstack;
  placed.tokens = ids.eq(token_id);
  *embeds = embeds->masked_scatter(placed.tokens.unsqueeze(-1).expand_as(*embeds),
                                   features.merged.to(embeds->scalar_type()));
  return placed;
}

// Qwen3-VL: each DeepStack layer's features of the images and of the videos, in the order of
// their tokens in the batch (where both are there), as transformers joins them.
StatusOr<std::vector<at::Tensor>> Qwen2VlModule::DeepStackInPositionOrder(
    const PlacedVisuals& images, const PlacedVisuals& videos) {
  if (videos.deepstack.empty()) return images.deepstack;
  if (images.deepstack.empty()) return videos.deepstack;
  if (images.deepstack.size() != videos.deepstack.size()) {
    return InternalError("the images and the videos have other numbers of DeepStack layers");
  }
  const at::Tensor visual = images.tokens.logical_or(videos.tokens);
  const at::Tensor image_rows = images.tokens.masked_select(visual);
  const at::Tensor video_rows = videos.tokens.masked_select(visual);
  std::vector<at::Tensor> joined;
  for (size_t layer = 0; layer < images.deepstack.size(); ++layer) {
    const at::Tensor& image = images.deepstack[layer];
    at::Tensor both = at::zeros({image_rows.size(0), image.size(-1)}, image.options());
    both.index_put_({image_rows}, image);
    both.index_put_({video_rows}, videos.deepstack[layer].to(image.scalar_type()));
    joined.push_back(both);
  }
  return joined;
}

StatusOr<at::Tensor> Qwen2VlModule::Hidden(const at::Tensor& input_ids,
                                           const at::Tensor& attention_mask,
                                           const ImagesOfBatch& images, const ImagesOfBatch& videos,
                                           bool checkpointing, KvCache* cache,
                                           std::vector<int64_t>* next_positions,
                                           at::Tensor* position_ids) {
  // The ids and the mask may come on the host (Qwen2-VL's host_fields) or on the device: the
  // positions and the token counts are worked out from host copies, the rest on the device.
  const at::Device device = lm.model->embed_tokens->weight.device();
  const at::Tensor host_ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor ids = input_ids.to(device, /*non_blocking=*/true);
  const at::Tensor mask =
      attention_mask.defined() ? attention_mask.to(device, /*non_blocking=*/true) : at::Tensor();
  at::Tensor embeds = lm.model->Embed(ids);
  ENGINE_ASSIGN_OR_RETURN(
      PlacedVisuals placed_images,
      Place(host_ids, ids, images, config_.image_token_id, kImageFields, checkpointing, &embeds));
  ENGINE_ASSIGN_OR_RETURN(
      PlacedVisuals placed_videos,
      Place(host_ids, ids, videos, config_.video_token_id, kVideoFields, checkpointing, &embeds));
  ENGINE_ASSIGN_OR_RETURN(
      MultimodalPositions positions,
      ComputeMultimodalPositions(host_ids,
                                 attention_mask.defined() ? attention_mask.cpu() : at::Tensor(),
                                 RowsOf(images, videos, config_.vision), config_.image_token_id,
                                 config_.video_token_id, config_.vision.spatial_merge_size));
  DecoderInputs inputs;
  inputs.attention_mask = mask;
  inputs.position_ids = positions.position_ids.to(device, /*non_blocking=*/true);
  ENGINE_ASSIGN_OR_RETURN(inputs.layer_additions,
                          DeepStackInPositionOrder(placed_images, placed_videos));
  if (!inputs.layer_additions.empty()) {
    inputs.addition_mask = placed_videos.deepstack.empty() ? placed_images.tokens
                           : placed_images.deepstack.empty()
                               ? placed_videos.tokens
                               : placed_images.tokens.logical_or(placed_videos.tokens);
  }
  if (next_positions != nullptr) *next_positions = positions.next;
  if (position_ids != nullptr) *position_ids = positions.position_ids;
  return lm.model->Forward(embeds, inputs, cache, checkpointing && cache == nullptr);
}

}  // namespace engine::transformer
