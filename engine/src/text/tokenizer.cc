#include "engine/tokenizer.h"

#include "engine/format.h"
#include "engine/hash.h"
#include "engine/paths.h"
#include "engine/untrusted_file.h"
#include "text/hf_json_tokenizer.h"
#include "text/sentencepiece_shim.h"

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
    ENGINE_ASSIGN_OR_RETURN(std::string bytes, ReadUntrustedFile(path, FileKind::kTokenizer));
    ENGINE_ASSIGN_OR_RETURN(const EngineSentencePieceApi* api, SentencePieceShim());
    std::string error;
    void* processor = api->load(bytes.data(), bytes.size(), &error);
    if (processor == nullptr) {
      return DataLossError("'" + path.string() + "' is not a SentencePiece model: " + error);
    }
    auto tokenizer = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer());
    tokenizer->api_ = api;
    tokenizer->processor_ = processor;
    tokenizer->path_ = path;
    tokenizer->hash_ = Fnv1a64Hex(bytes);
    int pieces = 0, bos = -1, eos = -1, pad = -1;
    api->info(processor, &pieces, &bos, &eos, &pad);
    tokenizer->pieces_ = pieces;
    tokenizer->bos_ = bos;
    tokenizer->eos_ = eos;
    // Models without a pad piece pad with an id past the vocabulary, which the vocabulary grows by.
    tokenizer->pad_ = pad >= 0 ? pad : pieces;
    tokenizer->vocab_ = std::max<int64_t>(pieces, tokenizer->pad_ + 1);
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }

  ~SentencePieceTokenizer() override {
    if (processor_ != nullptr) api_->free(processor_);
  }

  std::vector<int64_t> Encode(std::string_view text) const override {
    std::vector<int> pieces;
    api_->encode(processor_, text.data(), text.size(), &pieces);
    return std::vector<int64_t>(pieces.begin(), pieces.end());
  }
  std::string Decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> pieces;
    for (int64_t id : ids) {
      if (id >= 0 && id < pieces_ && id != bos_ && id != eos_ && id != pad_) {
        pieces.push_back(static_cast<int>(id));
      }
    }
    std::string text;
    api_->decode(processor_, &pieces, &text);
    return text;
  }
  int64_t vocab_size() const override { return vocab_; }
  int64_t pad_id() const override { return pad_; }
  int64_t bos_id() const override { return bos_; }
  int64_t eos_id() const override { return eos_; }
  std::string description() const override {
    return "SentencePiece " + path_.filename().string() + ", " + WithThousands(vocab_) + " ids";
  }
  std::string identity() const override { return "sentencepiece:" + hash_; }

 private:
  SentencePieceTokenizer() = default;

  const EngineSentencePieceApi* api_ = nullptr;
  void* processor_ = nullptr;
  std::filesystem::path path_;
  std::string hash_;
  int64_t pieces_ = 0;
  int64_t bos_ = -1;
  int64_t eos_ = -1;
  int64_t pad_ = 0;
  int64_t vocab_ = 0;
};

}  // namespace

void ValidateTokenizerOptions(const proto::TokenizerOptions& options, const std::string& prefix,
                              OptionErrors* errors) {
  if (options.kind() == proto::TokenizerOptions::SENTENCEPIECE && options.model_file().empty()) {
    errors->Add(prefix + "model_file", "is required for a SENTENCEPIECE tokenizer");
  }
  if (options.kind() == proto::TokenizerOptions::HF_JSON && options.path().empty()) {
    errors->Add(prefix + "path",
                "is required for an HF_JSON tokenizer (tokenizer.json or its "
                "directory)");
  }
}

StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const proto::TokenizerOptions& options,
                                                   const std::filesystem::path& base_dir) {
  if (options.kind() == proto::TokenizerOptions::BYTE) {
    return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  }
  if (options.kind() == proto::TokenizerOptions::HF_JSON) {
    if (options.path().empty()) {
      return InvalidArgumentError("tokenizer.path is required for an HF_JSON tokenizer");
    }
    return LoadHfJsonTokenizer(
        ResolvePath(base_dir, options.path()),
        options.config().empty() ? "" : ResolvePath(base_dir, options.config()));
  }
  if (options.model_file().empty()) {
    return InvalidArgumentError("tokenizer.model_file is required for a SENTENCEPIECE tokenizer");
  }
  return SentencePieceTokenizer::Load(ResolvePath(base_dir, options.model_file()));
}

}  // namespace engine
