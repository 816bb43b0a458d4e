// Image-text conversations into Qwen2-VL, checked against transformers: the chat loader turns
// LLaMA-Factory and Qwen-VL JSON Lines into the input_ids, pixel_values and image_grid_thw that
// transformers' Qwen2VLProcessor made for the qwen2_vl fixture (tests/fixtures/hf/
// qwen2_vl_fixture.py), and the qwen2_vl model loader, reading the fixture's checkpoint, computes
// transformers' logits from that batch.
//
// The fixture's tokenizer is the tokenizer.json and tokenizer_config.json transformers 5's
// Qwen2Tokenizer wrote; the test adds a ChatML template that renders a user turn and an answer as
// the fixture's texts spell them (no system prompt). Tolerances: ids, pixels and grids exact;
// logits 1e-4 (fp32).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/data.h"
#include "engine/model.h"
#include "engine/model_logits.h"
#include "engine/safetensors.h"
#include "engine/text_generator.h"
#include "plugins/plugin_test_util.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const fs::path kFixture = fs::path(testing::kSourceDir) / "tests/fixtures/hf/qwen2_vl";

constexpr char kChatMl[] =
    "{%- for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{%- endfor %}"
    "{% if add_generation_prompt %}{{ '\\n' }}<|im_start|>assistant\n{% endif %}";

// The fixture's tokenizer.json, its tokenizer_config.json with the template (ending turns at
// <|im_end|>), and the image processor's config, in `dir`.
void WriteTokenizer(const testing::TempDir& dir, const fs::path& fixture = kFixture) {
  fs::copy_file(fixture / "tokenizer.json", dir.path() / "tokenizer.json");
  nlohmann::json config =
      nlohmann::json::parse(testing::ReadText(fixture / "tokenizer_config.json"));
  config["chat_template"] = kChatMl;
  config["eos_token"] = "<|im_end|>";
  dir.Write("tokenizer_config.json", config.dump());
  fs::copy_file(fixture / "preprocessor_config.json", dir.path() / "preprocessor_config.json");
}

const DataLoaderPlugin& QwenVlChatPlugin() {
  return testing::BuiltinPlugin<DataLoaderPlugin>(PluginKind::kDataLoader, "chat");
}

StatusOr<std::unique_ptr<Dataset>> OpenChat(const testing::TempDir& dir, const std::string& lines,
                                            const std::string& extra = "") {
  dir.Write("data.jsonl", lines);
  auto options =
      testing::Options(QwenVlChatPlugin(),
                       "path: \"data.jsonl\" eval_fraction: 0 tokenizer { kind: HF_JSON path: \"" +
                           (dir.path() / "tokenizer.json").string() + "\" } " + extra);
  OptionErrors errors;
  QwenVlChatPlugin().ValidateOptions(*options, &errors);
  EXPECT_TRUE(errors.empty());
  return QwenVlChatPlugin().Open(*options, DataContext{dir.path(), 1});
}

// Rows 0 and 1 of the fixture: one image, then two, in the two layouts.
std::string FixtureLines(const fs::path& images) {
  nlohmann::json llama_factory = {{"messages",
                                   {{{"role", "user"}, {"content", "<image>Cat?"}},
                                    {{"role", "assistant"}, {"content", "Yes"}}}},
                                  {"images", {(images / "chelsea.png").string()}}};
  nlohmann::json qwen = {{"image", {"images/rocket.jpg", "images/camera.png"}},
                         {"conversations",
                          {{{"from", "human"}, {"value", "<image><image>Same?"}},
                           {{"from", "gpt"}, {"value", "No"}}}}};
  return llama_factory.dump() + "\n" + qwen.dump() + "\n";
}

struct Reference {
  std::shared_ptr<const safetensors::File> file;
  at::Tensor Get(const std::string& name) const { return *file->Get(name); }
  // Row `row`'s real tokens.
  at::Tensor Ids(int64_t row) const {
    return Get("input_ids")[row].masked_select(Get("attention_mask")[row].to(at::kBool));
  }
};

Reference ReadReference() {
  auto file = safetensors::File::Open(kFixture / "reference.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().message();
  return {*file};
}

class Qwen2VlDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteTokenizer(dir_);
    fs::copy(kFixture / "images", dir_.path() / "images");
  }
  // The batch of every train example, with the batch row of the example with `images` images.
  Batch Everything(const Dataset& data) {
    std::vector<int64_t> all;
    for (int64_t i = 0; i < data.size(Split::kTrain); ++i) all.push_back(i);
    auto batch = data.GetBatch(Split::kTrain, all);
    EXPECT_TRUE(batch.ok()) << batch.status().message();
    return *batch;
  }
  // The qwen2_vl loader's model of the fixture checkpoint for `data`, in eval mode (null after a
  // test failure).
  static std::unique_ptr<Model> FixtureModel(const Dataset& data,
                                             const fs::path& fixture = kFixture) {
    // The family's loader, named as its directory is.
    const auto& loader = testing::BuiltinPlugin<ModelLoaderPlugin>(PluginKind::kModelLoader,
                                                                   fixture.filename().string());
    auto options = testing::Options(loader, "pretrained: \"" + fixture.string() + "\"");
    OptionErrors errors;
    loader.ValidateOptions(*options, &errors);
    EXPECT_TRUE(errors.empty());
    ModelContext context;
    context.data = &data.spec();
    auto model = loader.Create(*options, context);
    EXPECT_TRUE(model.ok()) << model.status().message();
    if (!model.ok()) return nullptr;
    (*model)->module().eval();
    return std::move(*model);
  }
  static int64_t RowWithImages(const Batch& batch, int64_t images) {
    const at::Tensor grids = batch.at("image_grid_thw");
    for (int64_t row = 0; row < grids.size(0); ++row) {
      if (grids[row].select(1, 0).gt(0).sum().item<int64_t>() == images) return row;
    }
    ADD_FAILURE() << "no row with " << images << " images";
    return 0;
  }
  testing::TempDir dir_;
};

TEST_F(Qwen2VlDataTest, LoaderGivesTheIdsAndPixelsOfTransformersProcessor) {
  auto data = OpenChat(dir_, FixtureLines(dir_.path() / "images"));
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_THAT(
      (*data)->description(),
      HasSubstr("3 images (1 greyscale converted to RGB); image tokens min/median/max 2/4/6"));
  EXPECT_THAT((*data)->spec().ToString(),
              HasSubstr("pixel_values f32[?,1176], image_grid_thw i64[?,3]"));
  const Batch batch = Everything(**data);
  const Reference reference = ReadReference();
  const at::Tensor pixels = reference.Get("pixel_values"), grids = reference.Get("image_grid_thw");

  const int64_t one = RowWithImages(batch, 1);
  const at::Tensor ids =
      batch.at("input_ids")[one].masked_select(batch.at("attention_mask")[one].gt(0));
  EXPECT_TRUE(at::equal(ids, reference.Ids(0)));
  EXPECT_TRUE(at::equal(batch.at("pixel_values")[one].narrow(0, 0, 24), pixels.narrow(0, 0, 24)));
  EXPECT_TRUE(at::equal(batch.at("image_grid_thw")[one][0], grids[0]));
  // Loss on the answer and its end of turn only: "Yes" is three byte tokens, then <|im_end|>.
  const at::Tensor labels = batch.at("labels")[one];
  EXPECT_EQ(labels.ne(-100).sum().item<int64_t>(), 4);
  EXPECT_TRUE(at::equal(labels.masked_select(labels.ne(-100)), ids.narrow(0, ids.size(0) - 4, 4)));

  // The Qwen-VL layout with two images: the fixture's row 1 (which stops before <|im_end|>).
  const int64_t two = RowWithImages(batch, 2);
  const at::Tensor ids2 =
      batch.at("input_ids")[two].masked_select(batch.at("attention_mask")[two].gt(0));
  const at::Tensor expected2 = reference.Ids(1);
  EXPECT_TRUE(at::equal(ids2.narrow(0, 0, expected2.size(0)), expected2));
  EXPECT_TRUE(at::equal(batch.at("pixel_values")[two].narrow(0, 0, 24), pixels.narrow(0, 24, 24)));
  EXPECT_TRUE(at::equal(batch.at("image_grid_thw")[two].narrow(0, 0, 2), grids.narrow(0, 1, 2)));
}

TEST_F(Qwen2VlDataTest, ModelOnTheLoadersBatchGivesTheLossOfTransformersLogits) {
  auto data = OpenChat(dir_, FixtureLines(dir_.path() / "images"));
  ASSERT_TRUE(data.ok()) << data.status().message();
  const std::unique_ptr<Model> model = FixtureModel(**data);
  ASSERT_NE(model, nullptr);
  at::NoGradGuard no_grad;
  const Batch batch = Everything(**data);
  auto out = model->Forward(batch);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_TRUE(std::isfinite(out->loss.item<double>()));

  // The loss from transformers' logits: each answer token predicted from the position before it
  // (the fixture's rows hold those positions: row 1 stops at the answer's last token).
  const Reference reference = ReadReference();
  const at::Tensor reference_logits = reference.Get("logits");
  double nll = 0;
  int64_t counted = 0;
  for (auto [images, fixture_row] : {std::pair<int64_t, int64_t>{1, 0}, {2, 1}}) {
    const int64_t row = RowWithImages(batch, images);
    const at::Tensor labels = batch.at("labels")[row];
    const at::Tensor log_probs = at::log_softmax(reference_logits[fixture_row], -1);
    for (int64_t t = 1; t < labels.size(0); ++t) {
      const int64_t label = labels[t].item<int64_t>();
      if (label == -100) continue;
      nll -= log_probs[t - 1][label].item<double>();
      ++counted;
    }
  }
  EXPECT_EQ(LossCountOf(*out), counted);
  EXPECT_NEAR(out->loss.item<double>(), nll / static_cast<double>(counted), 1e-4);
}

// Generates 4 tokens after each row's prompt (its tokens before the answer, left-padded) of
// `batch`, with its `visual_fields`, and checks that the full forward of prompt and continuation
// predicts every generated token (exact match 1 by teacher forcing).
void ExpectGenerationContinuesTheFullForward(Model& model, const Batch& batch,
                                             const std::vector<std::string>& visual_fields) {
  auto* generator = dynamic_cast<ImageTextGenerator*>(&model);
  ASSERT_NE(generator, nullptr);
  const int64_t rows = batch.at("input_ids").size(0);
  std::vector<at::Tensor> prompts;
  int64_t longest = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const at::Tensor answer = batch.at("labels")[row].ne(-100).nonzero();
    prompts.push_back(batch.at("input_ids")[row].narrow(0, 0, answer[0][0].item<int64_t>()));
    longest = std::max(longest, prompts.back().size(0));
  }
  at::Tensor ids = at::zeros({rows, longest}, at::kLong), mask = at::zeros_like(ids);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t n = prompts[row].size(0);
    ids[row].narrow(0, longest - n, n).copy_(prompts[row]);
    mask[row].narrow(0, longest - n, n).fill_(1);
  }
  Batch visuals;
  for (const std::string& field : visual_fields) visuals[field] = batch.at(field);
  GenerationOptions generation;
  generation.max_new_tokens = 4;
  at::NoGradGuard no_grad;
  auto generated = generator->GenerateWithImages(ids, mask, visuals, generation);
  ASSERT_TRUE(generated.ok()) << generated.status().message();
  ASSERT_EQ(generated->sizes(), (std::vector<int64_t>{rows, 4}));

  // The prompts and their continuations, right-padded, the continuations as answers.
  const int64_t length = longest + 4;
  Batch full = visuals;
  full["input_ids"] = at::zeros({rows, length}, at::kLong);
  full["labels"] = at::full({rows, length}, -100, at::kLong);
  full["attention_mask"] = at::zeros({rows, length}, at::kLong);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t n = prompts[row].size(0);
    full["input_ids"][row].narrow(0, 0, n).copy_(prompts[row]);
    full["input_ids"][row].narrow(0, n, 4).copy_((*generated)[row]);
    full["labels"][row].narrow(0, n, 4).copy_((*generated)[row]);
    full["attention_mask"][row].narrow(0, 0, n + 4).fill_(1);
  }
  auto out = model.Forward(full);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->metrics.at("exact_match").count, rows);
  EXPECT_EQ(out->metrics.at("exact_match").sum, rows);
}

// Generation with images (the KV cache, and new tokens at the positions after the prompt's
// multimodal ones) continues each prompt exactly as a full forward over prompt and continuation
// predicts it: every generated token is the argmax there.
TEST_F(Qwen2VlDataTest, GeneratingWithImagesContinuesAsTheFullForwardPredicts) {
  auto data = OpenChat(dir_, FixtureLines(dir_.path() / "images"));
  ASSERT_TRUE(data.ok()) << data.status().message();
  const std::unique_ptr<Model> model = FixtureModel(**data);
  ASSERT_NE(model, nullptr);
  ExpectGenerationContinuesTheFullForward(*model, Everything(**data),
                                          {"pixel_values", "image_grid_thw"});
}

// Packed into one row, the two conversations (with their three images) give the loss they give
// one per row: each keeps its images, attends only within itself and counts its multimodal
// positions from 0.
TEST_F(Qwen2VlDataTest, PackedRowsWithImagesGiveTheLossOfTheirConversationsOneByOne) {
  auto loss = [&](const std::string& extra, int64_t expected_rows) {
    auto data = OpenChat(dir_, FixtureLines(dir_.path() / "images"), extra);
    EXPECT_TRUE(data.ok()) << data.status().message();
    EXPECT_EQ((*data)->size(Split::kTrain), expected_rows);
    const std::unique_ptr<Model> model = FixtureModel(**data);
    if (model == nullptr) return std::make_pair(0.0, int64_t{0});
    at::NoGradGuard no_grad;
    auto out = model->Forward(Everything(**data));
    EXPECT_TRUE(out.ok()) << out.status().message();
    return std::make_pair(out->loss.item<double>(), LossCountOf(*out));
  };
  const auto one_by_one = loss("max_length: 128", 2);
  const auto packed = loss("max_length: 128 packing: true", 1);
  EXPECT_EQ(packed.second, one_by_one.second);
  EXPECT_NEAR(packed.first, one_by_one.first, 1e-5);
}

TEST_F(Qwen2VlDataTest, BadImageLinesAreErrorsNamingTheFileLineAndImage) {
  const std::string truncated = testing::ReadText(kFixture / "images" / "chelsea.png");
  dir_.Write("images/cut.png", truncated.substr(0, truncated.size() / 2));
  auto line = [](const std::string& content, const nlohmann::json& images) {
    return nlohmann::json{
        {"messages",
         {{{"role", "user"}, {"content", content}}, {{"role", "assistant"}, {"content", "Yes"}}}},
        {"images", images}}
        .dump();
  };
  const std::string good = line("<image>Cat?", {"images/chelsea.png"}) + "\n";
  const std::string jsonl = (dir_.path() / "data.jsonl").string();
  struct Case {
    std::string line, message;
  };
  for (const Case& c :
       {Case{line("<image>Cat?", {"images/missing.png"}), "data.jsonl:2: cannot open '"},
        Case{line("<image>Cat?", {"images/cut.png"}), "cut.png' is not a readable PNG file"},
        Case{line("Cat?", {"images/chelsea.png"}),
             "data.jsonl:2: 0 <image> placeholder(s) in the messages for 1 image(s)"},
        Case{line("<image><image>Cat?", {"images/chelsea.png"}),
             "2 <image> placeholder(s) in the messages for 1 image(s)"},
        Case{line("<image>Cat?", {1}), "'images' must hold image paths (strings), not 1"}}) {
    SCOPED_TRACE(c.message);
    auto data = OpenChat(dir_, good + c.line + "\n");
    ASSERT_FALSE(data.ok());
    EXPECT_THAT(data.status().message(), HasSubstr(jsonl + ":2"));
    EXPECT_THAT(data.status().message(), HasSubstr(c.message));
  }
  auto too_large = OpenChat(dir_, good, "images { min_pixels: 9000 max_pixels: 8000 }");
  ASSERT_FALSE(too_large.ok());
  EXPECT_THAT(too_large.status().message(), HasSubstr("min_pixels 9000 is above max_pixels 8000"));
  fs::remove(dir_.path() / "preprocessor_config.json");
  auto no_processor = OpenChat(dir_, good);
  ASSERT_FALSE(no_processor.ok());
  EXPECT_THAT(no_processor.status().message(),
              HasSubstr("data.jsonl:1: the line names images, but there is no image processor"));
}

// max_length never cuts an image's tokens: an example whose image would start past it is dropped,
// also when its text is long enough that the encoding stops before the image.
TEST_F(Qwen2VlDataTest, ImagesPastMaxLengthDropTheirExampleAndTextPastItIsTruncated) {
  std::string words;
  for (int i = 0; i < 20000; ++i) words += "word" + std::to_string(i % 7) + " ";
  auto line = [](const std::string& question, const std::string& answer) {
    return nlohmann::json{{"messages",
                           {{{"role", "user"}, {"content", question}},
                            {{"role", "assistant"}, {"content", answer}}}},
                          {"images", {"images/chelsea.png"}}}
               .dump() +
           "\n";
  };
  const std::string lines =
      line("<image>Cat?", "Yes") + line(words + "<image>Cat?", "Yes") + line("<image>Cat?", words);
  auto truncated = OpenChat(dir_, lines, "max_length: 64");
  ASSERT_TRUE(truncated.ok()) << truncated.status().message();
  EXPECT_THAT((*truncated)->description(), HasSubstr("1 truncated to max_length 64"));
  EXPECT_THAT((*truncated)->description(),
              HasSubstr("dropped: 1 with image or video tokens beyond max_length 64"));
  auto dropped = OpenChat(dir_, lines, "max_length: 64 truncation: DROP");
  ASSERT_TRUE(dropped.ok()) << dropped.status().message();
  EXPECT_THAT((*dropped)->description(), HasSubstr("dropped: 2 longer than max_length 64"));

  // A pad token written in a message is counted on the whole text, however far the image is.
  auto written =
      OpenChat(dir_, line("<|image_pad|>" + words + "<image>Cat?", "Yes"), "max_length: 64");
  ASSERT_FALSE(written.ok());
  EXPECT_THAT(
      written.status().message(),
      HasSubstr("data.jsonl:1: the rendered text has 2 <|image_pad|> where the images need 1"));
}

TEST_F(Qwen2VlDataTest, ImagesOutsideTheDataDirectoryAreRefusedUnlessThePipelineAllowsThem) {
  testing::TempDir elsewhere;
  const fs::path outside = elsewhere.path() / "cat.png";
  fs::copy_file(kFixture / "images" / "chelsea.png", outside);
  fs::create_symlink(outside, dir_.path() / "images/link.png");
  fs::create_symlink("/dev/zero", dir_.path() / "images/zero.png");
  auto line = [](const std::string& image) {
    return nlohmann::json{{"messages",
                           {{{"role", "user"}, {"content", "<image>Cat?"}},
                            {{"role", "assistant"}, {"content", "Yes"}}}},
                          {"images", {image}}}
               .dump() +
           "\n";
  };
  const std::string way_out = "list their directory in images { allowed_dirs: ... }";
  for (const std::string& image :
       {outside.string(), std::string("../") + elsewhere.path().filename().string() + "/cat.png",
        std::string("images/link.png"), std::string("images/zero.png")}) {
    SCOPED_TRACE(image);
    auto data = OpenChat(dir_, line(image));
    ASSERT_FALSE(data.ok());
    EXPECT_THAT(data.status().message(), HasSubstr((dir_.path() / "data.jsonl").string() +
                                                   ":1: image '" + image + "' leads to '"));
    EXPECT_THAT(data.status().message(), HasSubstr(way_out));
  }
  // A special file inside the directory is refused by what it is.
  ASSERT_EQ(::mkfifo((dir_.path() / "images/fifo.png").c_str(), 0600), 0);
  auto fifo = OpenChat(dir_, line("images/fifo.png"));
  ASSERT_FALSE(fifo.ok());
  EXPECT_THAT(fifo.status().message(), HasSubstr("fifo.png' is a FIFO, not a regular image file"));

  const std::string allowed = "images { allowed_dirs: \"" + elsewhere.path().string() + "\" }";
  for (const std::string& image : {outside.string(), std::string("images/link.png")}) {
    auto data = OpenChat(dir_, line(image), allowed);
    ASSERT_TRUE(data.ok()) << data.status().message();
    EXPECT_THAT((*data)->description(), HasSubstr("1 image"));
  }
}

// Videos: the video fixture's two conversations (video_reference.safetensors, produce_videos in
// qwen2_vl_fixture.py) in LLaMA-Factory's layout, one video a directory of frames, the other a
// list of frame files after an image. Qwen2-VL's and Qwen2.5-VL's frames were taken one a second
// (Qwen2.5-VL's temporal positions step by 2 x 2 = 4), and their processor reads all 7; Qwen3-VL's
// four a second, and its processor samples 4 of the cat's 6 and writes each
// temporal patch's time into the text. The ids, the pixels of transformers' video processor (1e-5:
// its f32 normalisation) and the model's logits on the loader's batch (1e-4, fp32) are
// transformers'.
class Qwen2VlVideoDataTest : public Qwen2VlDataTest,
                             public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    fixture_ = fs::path(testing::kSourceDir) / "tests/fixtures/hf" / GetParam();
    WriteTokenizer(dir_, fixture_);
    fs::copy(fixture_ / "images", dir_.path() / "images");
    fs::copy(fixture_ / "videos", dir_.path() / "videos", fs::copy_options::recursive);
    fs::copy_file(fixture_ / "video_preprocessor_config.json",
                  dir_.path() / "video_preprocessor_config.json");
  }
  static std::string Line(const std::string& user, const std::string& answer,
                          const nlohmann::json& videos, const nlohmann::json& images = nullptr) {
    nlohmann::json line = {
        {"messages",
         {{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", answer}}}},
        {"videos", videos}};
    if (!images.is_null()) line["images"] = images;
    return line.dump() + "\n";
  }
  static std::string FixtureVideoLines() {
    nlohmann::json rocket = nlohmann::json::array();
    for (int i = 0; i < 4; ++i) {
      rocket.push_back("videos/rocket/frame_" + std::to_string(i) + ".png");
    }
    return Line("<video>What moves?", "The cat", {"videos/cat"}) +
           Line("<image><video>Same?", "No", nlohmann::json::array({rocket}),
                {"images/camera.png"});
  }
  Reference ReadVideoReference() const {
    auto file = safetensors::File::Open(fixture_ / "video_reference.safetensors");
    EXPECT_TRUE(file.ok()) << file.status().message();
    return {*file};
  }
  fs::path fixture_;
};

TEST_P(Qwen2VlVideoDataTest, LoaderGivesTheIdsPixelsAndLogitsOfTransformers) {
  const bool qwen3 = GetParam() == "qwen3_vl";
  auto data =
      OpenChat(dir_, FixtureVideoLines(), qwen3 ? "videos { fps: 4 }" : "videos { fps: 1 }");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_THAT((*data)->description(), HasSubstr(std::string("2 videos of ") + (qwen3 ? "8" : "7") +
                                                " frames; video tokens min/median/max 4/12/12"));
  EXPECT_THAT((*data)->spec().ToString(),
              HasSubstr("pixel_values_videos f32[?," + std::string(qwen3 ? "1536" : "1176") +
                        "], video_grid_thw i64[?,3], second_per_grid_ts f32[?]"));
  const Batch batch = Everything(**data);
  const Reference reference = ReadVideoReference();
  const int64_t cat = RowWithImages(batch, 0), rocket = RowWithImages(batch, 1);
  const at::Tensor ids =
      batch.at("input_ids")[cat].masked_select(batch.at("attention_mask")[cat].gt(0));
  EXPECT_TRUE(at::equal(ids, reference.Ids(0)));
  const at::Tensor expected_rocket = reference.Ids(1);
  EXPECT_TRUE(at::equal(batch.at("input_ids")[rocket].narrow(0, 0, expected_rocket.size(0)),
                        expected_rocket));
  const at::Tensor pixels = reference.Get("pixel_values_videos");
  EXPECT_TRUE(at::allclose(batch.at("pixel_values_videos")[cat].narrow(0, 0, 48),
                           pixels.narrow(0, 0, 48), 0, 1e-5));
  EXPECT_TRUE(at::allclose(batch.at("pixel_values_videos")[rocket].narrow(0, 0, 16),
                           pixels.narrow(0, 48, 16), 0, 1e-5));
  EXPECT_TRUE(at::equal(batch.at("video_grid_thw")[cat][0], reference.Get("video_grid_thw")[0]));
  if (!qwen3) EXPECT_EQ(batch.at("second_per_grid_ts")[cat][0].item<float>(), 2.0f);

  const std::unique_ptr<Model> model = FixtureModel(**data, fixture_);
  ASSERT_NE(model, nullptr);
  auto* logits_model = dynamic_cast<LogitsModel*>(model.get());
  ASSERT_NE(logits_model, nullptr);
  at::NoGradGuard no_grad;
  auto logits = logits_model->Logits(batch);
  ASSERT_TRUE(logits.ok()) << logits.status().message();
  for (auto [row, fixture_row] : {std::pair<int64_t, int64_t>{cat, 0}, {rocket, 1}}) {
    const int64_t real = reference.Ids(fixture_row).size(0);
    const at::Tensor ours = logits->logits[row].narrow(0, 0, real);
    const at::Tensor theirs = reference.Get("logits")[fixture_row].narrow(0, 0, real);
    EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-4) << "row " << fixture_row;
  }
}

// Generating after a video (and an image) continues as the full forward predicts: the cache's
// positions go on from each row's largest multimodal position plus one.
TEST_P(Qwen2VlVideoDataTest, GeneratingWithVideosContinuesAsTheFullForwardPredicts) {
  auto data = OpenChat(dir_, FixtureVideoLines(), "videos { fps: 4 }");
  ASSERT_TRUE(data.ok()) << data.status().message();
  const std::unique_ptr<Model> model = FixtureModel(**data, fixture_);
  ASSERT_NE(model, nullptr);
  ExpectGenerationContinuesTheFullForward(*model, Everything(**data),
                                          {"pixel_values", "image_grid_thw", "pixel_values_videos",
                                           "video_grid_thw", "second_per_grid_ts"});
}

// Videos cut by the other family's processor (patches of 16 pixels for 14, or the reverse) are
// refused when the model is built for the data, naming the field.
TEST_P(Qwen2VlVideoDataTest, AnotherFamilysVideoProcessorIsRefusedNamingTheField) {
  const char* other = GetParam() == "qwen3_vl" ? "qwen2_vl" : "qwen3_vl";
  fs::copy_file(fs::path(testing::kSourceDir) / "tests/fixtures/hf" / other /
                    "video_preprocessor_config.json",
                dir_.path() / "video_preprocessor_config.json",
                fs::copy_options::overwrite_existing);
  auto data = OpenChat(dir_, FixtureVideoLines(), "videos { fps: 4 }");
  ASSERT_TRUE(data.ok()) << data.status().message();
  const auto& loader =
      testing::BuiltinPlugin<ModelLoaderPlugin>(PluginKind::kModelLoader, GetParam());
  auto options = testing::Options(loader, "pretrained: \"" + fixture_.string() + "\"");
  ModelContext context;
  context.data = &(*data)->spec();
  auto model = loader.Create(*options, context);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("but the data's 'pixel_values_videos' are"));
}

TEST_P(Qwen2VlVideoDataTest, BadVideoLinesAreErrorsNamingTheFileLineAndVideo) {
  dir_.Write("videos/film.mp4", "not decoded");
  fs::create_directories(dir_.path() / "videos/mixed");
  for (const char* frame : {"a.png", "b.png"}) {  // two sizes; sampling keeps both
    fs::copy_file(fixture_ / "videos/cat/frame_0.png", dir_.path() / "videos/mixed" / frame);
  }
  for (const char* frame : {"c.png", "d.png"}) {
    fs::copy_file(fixture_ / "videos/rocket/frame_0.png", dir_.path() / "videos/mixed" / frame);
  }
  fs::create_directories(dir_.path() / "videos/empty");
  const std::string good = Line("<video>What moves?", "The cat", {"videos/cat"});
  const std::string jsonl = (dir_.path() / "data.jsonl").string();
  struct Case {
    std::string line, message;
  };
  for (const Case& c :
       {Case{Line("<video>What?", "x", {"videos/film.mp4"}),
             "video 'videos/film.mp4' is neither a directory of frames nor an image file; this "
             "engine decodes no video files"},
        Case{Line("<video>What?", "x", {"videos/mixed"}), "a video's frames have one size"},
        Case{Line("<video>What?", "x", {"videos/empty"}), "is a directory without image files"},
        Case{Line("<video>What?", "x", {"../outside"}), "outside '"},
        Case{Line("What?", "x", {"videos/cat"}),
             "0 <video> placeholder(s) in the messages for 1 video(s)"},
        Case{Line("<video>What?", "x", nlohmann::json::parse("[[]]")),
             "holds a video without frames"},
        Case{Line("<video>What?", "x",
                  nlohmann::json::parse(R"([["images/logo.png", "images/logo.png"]])")),
             "logo.png': a video frame with transparency (RGBA)"},
        Case{R"({"messages": [{"role": "user", "content": [{"type": "video", "video": "c"}]}, )"
             R"({"role": "assistant", "content": "x"}]})",
             "messages[0] holds a video content part; name videos in \"videos\""}}) {
    SCOPED_TRACE(c.message);
    auto data = OpenChat(dir_, good + c.line + "\n");
    ASSERT_FALSE(data.ok());
    EXPECT_THAT(data.status().message(), HasSubstr(jsonl + ":2"));
    EXPECT_THAT(data.status().message(), HasSubstr(c.message));
  }
  // A video processor this engine does not know is refused when a line needs it, naming the key;
  // lines without videos still open.
  nlohmann::json other =
      nlohmann::json::parse(testing::ReadText(fixture_ / "video_preprocessor_config.json"));
  other["video_processor_type"] = "InternVLVideoProcessor";
  dir_.Write("video_preprocessor_config.json", other.dump());
  auto refused = OpenChat(dir_, good);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr(jsonl + ":1: the line names videos"));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("'video_processor_type' \"InternVLVideoProcessor\" is not supported"));
  EXPECT_TRUE(OpenChat(dir_, Line("Cat?", "Yes", nullptr)).ok());
}

INSTANTIATE_TEST_SUITE_P(Families, Qwen2VlVideoDataTest,
                         ::testing::Values("qwen2_vl", "qwen2_5_vl", "qwen3_vl"));

}  // namespace
}  // namespace engine
