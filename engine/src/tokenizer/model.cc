#include "tokenizer/model.h"

#include "tokenizer/bpe_model.h"
#include "tokenizer/unigram_model.h"
#include "tokenizer/wordpiece_model.h"

namespace engine::tokenizer {

StatusOr<std::unique_ptr<Model>> ParseModel(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(std::string type, TypeField(json, path));
  if (type == "BPE") return BpeModel::Parse(json, path);
  if (type == "Unigram") return UnigramModel::Parse(json, path);
  if (type == "WordPiece") return WordPieceModel::Parse(json, path);
  return FieldError(path + ".type",
                    "unsupported model '" + type + "' (supported: BPE, Unigram, WordPiece)");
}

}  // namespace engine::tokenizer
