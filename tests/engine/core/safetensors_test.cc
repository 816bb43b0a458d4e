#include "engine/safetensors.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "testing/temp_dir.h"

namespace engine::safetensors {
namespace {

using engine::testing::ReadText;
using engine::testing::TempDir;

// Writes raw bytes: an 8-byte little-endian header length, the header, then `data`.
void WriteRaw(const std::filesystem::path& path, const std::string& header, const std::string& data,
              uint64_t claimed_length = UINT64_MAX) {
  uint64_t n = claimed_length == UINT64_MAX ? header.size() : claimed_length;
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << bytes << header << data;
}

std::string ErrorOf(const std::filesystem::path& path) {
  auto file = File::Open(path);
  return file.ok() ? std::string("(opened)") : file.status().message();
}

TEST(SafetensorsTest, RoundTripsEveryDtype) {
  TempDir dir;
  NamedTensors tensors = {
      {"f64", at::arange(6, at::kDouble).reshape({2, 3}) / 7},
      {"f32", at::randn({3, 5})},
      {"f16", at::randn({4, 3}).to(at::kHalf)},
      {"bf16", at::randn({7}).to(at::kBFloat16)},
      {"i64", at::arange(-5, 5, at::kLong)},
      {"i32", at::arange(-3, 3, at::kInt).reshape({2, 3})},
      {"i16", at::arange(-4, 4, at::kShort)},
      {"i8", at::arange(-8, 8, at::kChar)},
      {"u8", at::arange(0, 255, at::kByte)},
      {"bool", at::arange(6, at::kLong).remainder(2).to(at::kBool)},
      {"scalar", at::arange(1, at::kFloat).reshape({})},
  };
  const auto path = dir.path() / "all.safetensors";
  ASSERT_TRUE(Write(path, tensors, {{"step", "12"}, {"note", "a \"quoted\" value"}}).ok());
  auto file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->metadata().at("step"), "12");
  EXPECT_EQ((*file)->metadata().at("note"), "a \"quoted\" value");
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    auto got = (*file)->Get(name);
    ASSERT_TRUE(got.ok()) << name;
    EXPECT_EQ(got->scalar_type(), expected.scalar_type()) << name;
    EXPECT_EQ(got->sizes(), expected.sizes()) << name;
    EXPECT_TRUE(at::equal(*got, expected)) << name;
  }
}

TEST(SafetensorsTest, HeaderFollowsTheFormat) {
  TempDir dir;
  const auto path = dir.path() / "x.safetensors";
  ASSERT_TRUE(Write(path, {{"b", at::randn({2})}, {"a", at::ones({3}, at::kHalf)}}).ok());
  const std::string bytes = ReadText(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section starts 8-byte aligned";
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["b"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["dtype"], "F16");
  EXPECT_EQ(header["b"]["shape"], nlohmann::json::array({2}));
  // Larger items first: the f32 tensor starts at 0, the f16 one after it.
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({8, 14}));
  EXPECT_FALSE(header.contains("__metadata__"));
  EXPECT_EQ(bytes.size(), 8 + n + 14);
}

TEST(SafetensorsTest, ReadsAFileWrittenByHand) {
  TempDir dir;
  const auto path = dir.path() / "hand.safetensors";
  float values[3] = {1.5f, -2.0f, 3.25f};
  std::string data(reinterpret_cast<const char*>(values), sizeof(values));
  WriteRaw(path,
           R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"__metadata__":{"k":"v"}})",
           data);
  auto file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto w = (*file)->Get("w");
  ASSERT_TRUE(w.ok());
  // The header length here is not a multiple of 8: the tensor is misaligned and gets copied.
  EXPECT_FLOAT_EQ(w->data_ptr<float>()[0], 1.5f);
  EXPECT_FLOAT_EQ(w->data_ptr<float>()[2], 3.25f);
  EXPECT_EQ((*file)->metadata().at("k"), "v");
}

TEST(SafetensorsTest, EmptyTensorsAndEmptyFiles) {
  TempDir dir;
  const auto path = dir.path() / "empty.safetensors";
  NamedTensors tensors = {{"none", at::randn({0})},
                          {"zero_rows", at::randn({0, 4})},
                          {"x", at::ones({2}, at::kBFloat16)}};
  ASSERT_TRUE(Write(path, tensors).ok());
  auto file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->Get("zero_rows")->sizes(), at::IntArrayRef({0, 4}));
  EXPECT_EQ((*file)->Get("none")->numel(), 0);
  EXPECT_TRUE(at::equal(*(*file)->Get("x"), tensors[2].second));

  const auto nothing = dir.path() / "nothing.safetensors";
  ASSERT_TRUE(Write(nothing, {}).ok());
  auto empty = File::Open(nothing);
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_TRUE((*empty)->tensors().empty());
}

TEST(SafetensorsTest, LargeHeader) {
  TempDir dir;
  NamedTensors tensors;
  for (int i = 0; i < 3000; ++i) {
    tensors.emplace_back(
        "model.layers." + std::to_string(i) + ".self_attn.a_rather_long_projection_name.weight",
        at::full({2}, static_cast<double>(i), at::kFloat));
  }
  const auto path = dir.path() / "big.safetensors";
  ASSERT_TRUE(Write(path, tensors).ok());
  EXPECT_GT(std::filesystem::file_size(path), 200000u);
  auto file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->tensors().size(), 3000u);
  auto t = (*file)->Get("model.layers.2999.self_attn.a_rather_long_projection_name.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->data_ptr<float>()[1], 2999.0f);
}

TEST(SafetensorsTest, NonContiguousInputsAreWrittenInLogicalOrder) {
  TempDir dir;
  at::Tensor t = at::arange(12, at::kFloat).reshape({3, 4}).t();
  ASSERT_FALSE(t.is_contiguous());
  const auto path = dir.path() / "t.safetensors";
  ASSERT_TRUE(Write(path, {{"t", t}}).ok());
  auto file = File::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(at::equal(*(*file)->Get("t"), t));
}

TEST(SafetensorsTest, TensorsOutliveTheFileAndNeverWriteBack) {
  TempDir dir;
  const auto path = dir.path() / "m.safetensors";
  ASSERT_TRUE(Write(path, {{"w", at::ones({1024})}}).ok());
  at::Tensor w;
  {
    auto file = File::Open(path);
    ASSERT_TRUE(file.ok());
    w = *(*file)->Get("w");
  }
  w.mul_(3);  // the mapping is private: this must not reach the file
  EXPECT_EQ(w.data_ptr<float>()[10], 3.0f);
  auto again = File::Open(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Get("w")->data_ptr<float>()[10], 1.0f);
}

TEST(SafetensorsTest, RejectsBadWrites) {
  TempDir dir;
  const auto path = dir.path() / "bad.safetensors";
  EXPECT_FALSE(Write(path, {{"a", at::ones({1})}, {"a", at::ones({1})}}).ok());
  EXPECT_FALSE(Write(path, {{"", at::ones({1})}}).ok());
  EXPECT_FALSE(Write(path, {{"__metadata__", at::ones({1})}}).ok());
  EXPECT_FALSE(Write(path, {{"c", at::ones({1}, at::kComplexFloat)}}).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsTest, RejectsTruncatedFilesAtEveryLength) {
  TempDir dir;
  const auto good = dir.path() / "good.safetensors";
  ASSERT_TRUE(Write(good, {{"a", at::randn({5})}, {"b", at::randn({3}).to(at::kBFloat16)}}).ok());
  const std::string bytes = ReadText(good);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    const auto path = dir.path() / "cut.safetensors";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, cut);
    auto file = File::Open(path);
    EXPECT_FALSE(file.ok()) << "a file cut at " << cut << " of " << bytes.size()
                            << " bytes was accepted";
    if (!file.ok()) {
      EXPECT_NE(file.status().message().find("cut.safetensors"), std::string::npos);
    }
  }
}

TEST(SafetensorsTest, RejectsCorruptHeaders) {
  TempDir dir;
  const auto path = dir.path() / "c.safetensors";
  const std::string eight(8, '\0');
  auto expect_error = [&](const std::string& header, const std::string& data,
                          const std::string& fragment) {
    WriteRaw(path, header, data);
    const std::string error = ErrorOf(path);
    EXPECT_NE(error.find(fragment), std::string::npos) << "header " << header << " gave: " << error;
  };
  expect_error("{not json", eight, "not valid JSON");
  expect_error("[1,2]", "", "not an object");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               eight, "names 'a' twice");
  expect_error(R"({"a":{"dtype":"F9","shape":[2],"data_offsets":[0,8]}})", eight,
               "dtype 'F9' is not supported");
  expect_error(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight,
               "its shape needs 12 bytes");
  expect_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight,
               "outside the 8 data bytes");
  expect_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight, "(gap)");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               eight, "(overlap)");
  expect_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight,
               "cover 4 data bytes but the file holds 8");
  expect_error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", eight,
               "'shape' holds something other than sizes");
  expect_error(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", eight, "'dtype' is missing");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight,
               "'data_offsets' must be two");
  expect_error(R"({"__metadata__":{"k":1}})", "", "metadata 'k' is not a string");

  WriteRaw(path, "{}", "", /*claimed_length=*/200 * 1000 * 1000);
  EXPECT_NE(ErrorOf(path).find("limit"), std::string::npos);
  WriteRaw(path, "{}", "", /*claimed_length=*/1000);
  EXPECT_NE(ErrorOf(path).find("truncated"), std::string::npos);
  EXPECT_NE(ErrorOf(dir.path() / "missing.safetensors").find("cannot open"), std::string::npos);
}

// A header of nested arrays or millions of values used to be parsed whole (a 99 MB one took
// 3.5 GB); it stops at the first value past the budget.
TEST(SafetensorsTest, HeadersAreParsedWithinANestingAndValueBudget) {
  TempDir dir;
  const auto path = dir.path() / "h.safetensors";
  const int deep = 10 * 1000 * 1000;
  WriteRaw(path, "{\"a\":" + std::string(deep, '[') + std::string(deep, ']') + "}", "");
  EXPECT_NE(ErrorOf(path).find("its header nests arrays or objects more than 3 deep"),
            std::string::npos)
      << ErrorOf(path);
  std::string many = R"({"a":{"dtype":"U8","data_offsets":[0,0],"shape":[)";
  for (int i = 0; i < 4200000; ++i) many += "0,";
  many += "0]}}";
  WriteRaw(path, many, "");
  EXPECT_NE(ErrorOf(path).find("its header holds more than 4194304 values"), std::string::npos)
      << ErrorOf(path);
  // A real header: three deep.
  WriteRaw(path,
           R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           std::string(8, '\0'));
  EXPECT_TRUE(File::Open(path).ok()) << ErrorOf(path);
}

TEST(SafetensorsTest, AFifoOrDirectoryInAFilesPlaceIsRefusedWithoutWaiting) {
  TempDir dir;
  const auto fifo = dir.path() / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ErrorOf(fifo), "'" + fifo.string() + "' is a FIFO, not a regular safetensors file");
  EXPECT_EQ(ErrorOf(dir.path()),
            "'" + dir.path().string() + "' is a directory, not a regular safetensors file");
}

TEST(SafetensorsTest, GetNamesTheMissingTensor) {
  TempDir dir;
  const auto path = dir.path() / "g.safetensors";
  ASSERT_TRUE(Write(path, {{"a", at::ones({1})}}).ok());
  auto file = File::Open(path);
  ASSERT_TRUE(file.ok());
  auto missing = (*file)->Get("b");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no tensor 'b'"), std::string::npos);
}

TEST(AtomicFileTest, ReplacesWholeOrNotAtAll) {
  TempDir dir;
  const auto path = dir.path() / "f.txt";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  EXPECT_EQ(ReadText(path), "first");
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(ReadText(path), "second");
  // A writer that fails half-way leaves the old content and no temporary file behind.
  Status failed = WriteFileAtomically(path, [](const ByteSink& sink) -> Status {
    ENGINE_RETURN_IF_ERROR(sink("third, half", 11));
    return IoError("disk full (simulated)");
  });
  EXPECT_EQ(failed.message(), "disk full (simulated)");
  EXPECT_EQ(ReadText(path), "second");
  int files = 0;
  for (const auto& item : std::filesystem::directory_iterator(dir.path())) {
    (void)item;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(AtomicFileTest, UnwritableDirectoryIsAClearError) {
  Status s = WriteFileAtomically("/nonexistent-dir-for-engine-tests/x", "y");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot create"), std::string::npos);
}

}  // namespace
}  // namespace engine::safetensors
