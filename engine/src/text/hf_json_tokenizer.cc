#include "text/hf_json_tokenizer.h"

#include <nlohmann/json.hpp>

#include "engine/format.h"
#include "engine/hash.h"
#include "engine/untrusted_file.h"
#include "tokenizer/hf_tokenizer.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

class HfJsonTokenizer : public Tokenizer {
 public:
  HfJsonTokenizer(std::unique_ptr<tokenizer::HfTokenizer> impl, fs::path path, std::string hash)
      : impl_(std::move(impl)), path_(std::move(path)), hash_(std::move(hash)) {}

  std::vector<int64_t> Encode(std::string_view text) const override {
    return impl_->Encode(text, /*add_special_tokens=*/false);
  }
  std::vector<int64_t> EncodeAtMost(std::string_view text, size_t max_tokens) const override {
    return impl_->Encode(text, /*add_special_tokens=*/false, max_tokens);
  }
  std::string Decode(const std::vector<int64_t>& ids) const override {
    return impl_->Decode(ids, /*skip_special_tokens=*/true);
  }
  std::string DecodeWithSpecialTokens(const std::vector<int64_t>& ids) const override {
    return impl_->Decode(ids, /*skip_special_tokens=*/false);
  }
  int64_t vocab_size() const override { return vocab_; }
  int64_t pad_id() const override { return pad_; }
  int64_t bos_id() const override { return bos_; }
  int64_t eos_id() const override { return eos_; }
  std::string description() const override {
    return "tokenizer.json " + path_.string() + ", " + WithThousands(vocab_) + " ids";
  }
  std::string identity() const override { return "hf_json:" + hash_; }

  // Sets the special ids from tokenizer_config.json's fields (or the fallbacks).
  Status ReadSpecialIds(const nlohmann::json& config, const std::string& origin) {
    ENGINE_ASSIGN_OR_RETURN(bos_, SpecialId(config, "bos_token", origin));
    ENGINE_ASSIGN_OR_RETURN(eos_, SpecialId(config, "eos_token", origin));
    ENGINE_ASSIGN_OR_RETURN(pad_, SpecialId(config, "pad_token", origin));
    if (!config.contains("bos_token") && !impl_->post_processor().prefix().empty()) {
      bos_ = impl_->post_processor().prefix().front();
    }
    vocab_ = impl_->vocab_size();
    if (pad_ < 0) pad_ = vocab_++;
    return Status::Ok();
  }

 private:
  // A special token given as a string or as {"content": ...}; null or absent: -1.
  StatusOr<int64_t> SpecialId(const nlohmann::json& config, const std::string& key,
                              const std::string& origin) const {
    const auto found = config.find(key);
    if (found == config.end() || found->is_null()) return int64_t{-1};
    std::string content;
    if (found->is_string()) {
      content = found->get<std::string>();
    } else if (found->is_object() && found->contains("content") &&
               (*found)["content"].is_string()) {
      content = (*found)["content"].get<std::string>();
    } else {
      return InvalidArgumentError(origin + ": " + key + " must be a string or {\"content\": ...}");
    }
    const int64_t id = impl_->TokenId(content);
    if (id < 0) {
      return InvalidArgumentError(origin + ": " + key + " '" + content +
                                  "' is not a token of the tokenizer");
    }
    return id;
  }

  std::unique_ptr<tokenizer::HfTokenizer> impl_;
  fs::path path_;
  std::string hash_;
  int64_t bos_ = -1, eos_ = -1, pad_ = -1, vocab_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> LoadHfJsonTokenizer(const fs::path& path,
                                                         const fs::path& config_path) {
  const fs::path file = fs::is_directory(path) ? path / "tokenizer.json" : path;
  ENGINE_ASSIGN_OR_RETURN(std::string bytes, ReadUntrustedFile(file, FileKind::kTokenizer));
  ENGINE_ASSIGN_OR_RETURN(auto impl, tokenizer::HfTokenizer::FromJson(bytes, file.string()));
  nlohmann::json config = nlohmann::json::object();
  const fs::path config_file =
      config_path.empty() ? file.parent_path() / "tokenizer_config.json" : config_path;
  if (!config_path.empty() || fs::exists(config_file)) {
    ENGINE_ASSIGN_OR_RETURN(std::string text, ReadUntrustedFile(config_file, FileKind::kConfig));
    config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) {
      return DataLossError("'" + config_file.string() + "' is not a JSON object");
    }
  }
  auto tokenizer = std::make_unique<HfJsonTokenizer>(std::move(impl), file, Fnv1a64Hex(bytes));
  ENGINE_RETURN_IF_ERROR(tokenizer->ReadSpecialIds(config, "'" + config_file.string() + "'"));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace engine
