#include "engine/tokenizer.h"

#include <sentencepiece_processor.h>

#include "engine/atomic_file.h"
#include "engine/format.h"
#include "engine/hash.h"

namespace engine {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int64_t> Encode(std::string_view text) const override {
    std::vector<int64_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string Decode(const std::vector<int64_t>& ids) const override {
    std::string text;
    for (int64_t id : ids) {
      if (id >= 0 && id < 256) text.push_back(static_cast<char>(id));
    }
    return text;
  }
  int64_t vocab_size() const override { return 259; }
  int64_t pad_id() const override { return 256; }
  int64_t bos_id() const override { return 257; }
  int64_t eos_id() const override { return 258; }
  std::string description() const override { return "byte-level, 259 ids"; }
  std::string identity() const override { return "byte"; }
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::filesystem::path& path) {
    ENGINE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    auto tokenizer = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer());
    const auto status = tokenizer->processor_.LoadFromSerializedProto(bytes);
    if (!status.ok()) {
      return DataLossError("'" + path.string() +
                           "' is not a SentencePiece model: " + status.ToString());
    }
    tokenizer->path_ = path;
    tokenizer->hash_ = Fnv1a64Hex(bytes);
    const int size = tokenizer->processor_.GetPieceSize();
    // Models without a pad piece pad with an id past the vocabulary, which the vocabulary grows by.
    tokenizer->pad_ = tokenizer->processor_.pad_id() >= 0 ? tokenizer->processor_.pad_id() : size;
    tokenizer->vocab_ = std::max<int64_t>(size, tokenizer->pad_ + 1);
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }

  std::vector<int64_t> Encode(std::string_view text) const override {
    std::vector<int> pieces;
    processor_.Encode(text, &pieces).IgnoreError();
    return std::vector<int64_t>(pieces.begin(), pieces.end());
  }
  std::string Decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> pieces;
    for (int64_t id : ids) {
      if (id >= 0 && id < processor_.GetPieceSize() && id != bos_id() && id != eos_id() &&
          id != pad_id()) {
        pieces.push_back(static_cast<int>(id));
      }
    }
    std::string text;
    processor_.Decode(pieces, &text).IgnoreError();
    return text;
  }
  int64_t vocab_size() const override { return vocab_; }
  int64_t pad_id() const override { return pad_; }
  int64_t bos_id() const override { return processor_.bos_id(); }
  int64_t eos_id() const override { return processor_.eos_id(); }
  std::string description() const override {
    return "SentencePiece " + path_.filename().string() + ", " + WithThousands(vocab_) + " ids";
  }
  std::string identity() const override { return "sentencepiece:" + hash_; }

 private:
  sentencepiece::SentencePieceProcessor processor_;
  std::filesystem::path path_;
  std::string hash_;
  int64_t pad_ = 0;
  int64_t vocab_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const proto::TokenizerOptions& options,
                                                   const std::filesystem::path& base_dir) {
  if (options.kind() == proto::TokenizerOptions::BYTE) {
    return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  }
  if (options.model_file().empty()) {
    return InvalidArgumentError("tokenizer.model_file is required for a SENTENCEPIECE tokenizer");
  }
  std::filesystem::path path(options.model_file());
  if (path.is_relative()) path = base_dir / path;
  return SentencePieceTokenizer::Load(path.lexically_normal());
}

}  // namespace engine
