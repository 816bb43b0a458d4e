#include "tokenizer/vocabulary.h"

#include <algorithm>
#include <cstdio>

namespace engine::tokenizer {

StatusOr<Vocabulary> Vocabulary::FromObject(const Json& vocab, const std::string& path) {
  // Ids index a table, so an id far past the number of tokens would cost memory for nothing: a
  // hub file gets as many unused ids as it has tokens, and a margin.
  const int64_t largest_id = static_cast<int64_t>(vocab.size()) * 2 + kUnusedIdMargin;
  Vocabulary result;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return FieldError(path + "[\"" + token + "\"]", "must be a non-negative integer id");
    }
    if (id.get<int64_t>() > largest_id) {
      return FieldError(path + "[\"" + token + "\"]",
                        "id " + std::to_string(id.get<int64_t>()) + " is far past the " +
                            std::to_string(vocab.size()) + " tokens of the vocabulary");
    }
    result.Add(token, static_cast<int32_t>(id.get<int64_t>()));
  }
  return result;
}

void Vocabulary::Add(std::string token, int32_t id) {
  if (static_cast<size_t>(id) >= tokens_.size()) {
    tokens_.resize(static_cast<size_t>(id) + 1);
    present_.resize(static_cast<size_t>(id) + 1, false);
  }
  tokens_[id] = token;
  present_[id] = true;
  longest_ = std::max(longest_, token.size());
  ids_[std::move(token)] = id;
}

int64_t Vocabulary::Id(const std::string& token) const {
  const auto found = ids_.find(token);
  return found == ids_.end() ? -1 : found->second;
}

const std::string* Vocabulary::Token(int64_t id) const {
  if (id < 0 || id >= size() || !present_[id]) return nullptr;
  return &tokens_[id];
}

std::vector<int32_t> Vocabulary::ByteIds() const {
  std::vector<int32_t> ids(256, -1);
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", byte);
    ids[byte] = static_cast<int32_t>(Id(std::string(name)));
  }
  return ids;
}

}  // namespace engine::tokenizer
