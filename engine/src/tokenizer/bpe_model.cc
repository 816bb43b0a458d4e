#include "tokenizer/bpe_model.h"

#include <queue>

#include "tokenizer/utf8.h"

namespace engine::tokenizer {

StatusOr<std::unique_ptr<Model>> BpeModel::Parse(const Json& json, const std::string& path) {
  if (const auto dropout = json.find("dropout");
      dropout != json.end() && !dropout->is_null() &&
      (!dropout->is_number() || dropout->get<double>() != 0.0)) {
    return FieldError(path + ".dropout", "BPE dropout is for training tokenizers; set it to null");
  }
  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  ENGINE_ASSIGN_OR_RETURN(const Json* vocab, ObjectField(json, "vocab", path));
  ENGINE_ASSIGN_OR_RETURN(model->vocab_, Vocabulary::FromObject(*vocab, path + ".vocab"));
  ENGINE_ASSIGN_OR_RETURN(model->continuing_subword_prefix_,
                          StringField(json, "continuing_subword_prefix", path, ""));
  ENGINE_ASSIGN_OR_RETURN(model->end_of_word_suffix_,
                          StringField(json, "end_of_word_suffix", path, ""));
  ENGINE_ASSIGN_OR_RETURN(model->fuse_unk_, BoolField(json, "fuse_unk", path, false));
  ENGINE_ASSIGN_OR_RETURN(model->byte_fallback_, BoolField(json, "byte_fallback", path, false));
  ENGINE_ASSIGN_OR_RETURN(model->ignore_merges_, BoolField(json, "ignore_merges", path, false));
  ENGINE_ASSIGN_OR_RETURN(std::string unk, StringField(json, "unk_token", path, ""));
  if (!unk.empty()) {
    model->unk_id_ = static_cast<int32_t>(model->Id(unk));
    if (model->unk_id_ < 0) {
      return FieldError(path + ".unk_token", "'" + unk + "' is not in the vocabulary");
    }
  }
  ENGINE_ASSIGN_OR_RETURN(const Json* merges, ArrayField(json, "merges", path));
  ENGINE_RETURN_IF_ERROR(model->ParseMerges(*merges, path + ".merges"));
  model->byte_ids_ = model->vocab_.ByteIds();
  return std::unique_ptr<Model>(std::move(model));
}

Status BpeModel::ParseMerges(const Json& merges, const std::string& path) {
  merges_.reserve(merges.size());
  const size_t prefix = continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& merge = merges[rank];
    const std::string where = path + "[" + std::to_string(rank) + "]";
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos) return FieldError(where, "'" + text + "' is not \"a b\"");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return FieldError(where, "must be \"a b\" or [\"a\", \"b\"]");
    }
    const int64_t left_id = Id(left), right_id = Id(right);
    // The merged token drops the right part's continuing-subword prefix.
    const std::string merged =
        left + (prefix > 0 && right.compare(0, prefix, continuing_subword_prefix_) == 0
                    ? right.substr(prefix)
                    : right);
    const int64_t new_id = Id(merged);
    if (left_id < 0 || right_id < 0 || new_id < 0) {
      return FieldError(where, "merge '" + left + "' + '" + right +
                                   "' names a token missing from the vocabulary");
    }
    merges_.emplace(PairKey(left_id, right_id),
                    Merge{static_cast<int32_t>(rank), static_cast<int32_t>(new_id)});
  }
  return Status::Ok();
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  int32_t pending_unk = -1;
  size_t pos = 0;
  std::string piece;
  while (pos < word.size()) {
    size_t end = pos + 1;
    while (end < word.size() && IsContinuationByte(word[end])) ++end;
    piece.assign(word.substr(pos, end - pos));
    if (pos > 0) piece.insert(0, continuing_subword_prefix_);
    if (end == word.size()) piece += end_of_word_suffix_;
    pos = end;
    if (const int64_t id = vocab_.Id(piece); id >= 0) {
      if (pending_unk >= 0) symbols->push_back(pending_unk);
      pending_unk = -1;
      symbols->push_back(static_cast<int32_t>(id));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char byte : piece) all = all && byte_ids_[static_cast<unsigned char>(byte)] >= 0;
      if (all) {
        // As the tokenizers crate does, a pending unk stays pending across byte tokens.
        for (char byte : piece) symbols->push_back(byte_ids_[static_cast<unsigned char>(byte)]);
        continue;
      }
    }
    if (unk_id_ < 0) continue;
    if (pending_unk >= 0 && !fuse_unk_) symbols->push_back(pending_unk);
    pending_unk = unk_id_;
  }
  if (pending_unk >= 0) symbols->push_back(pending_unk);
}

void BpeModel::MergeAll(std::vector<int32_t>* symbols) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  std::vector<int32_t>& ids = *symbols;
  std::vector<int> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator<(const Candidate& other) const {  // lowest rank, then leftmost, on top
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  const auto push = [&](int left) {
    const int right = next[left];
    if (right < 0) return;
    const auto found = merges_.find(PairKey(ids[left], ids[right]));
    if (found != merges_.end()) queue.push({found->second.rank, left, found->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    const auto found = merges_.find(PairKey(ids[top.pos], ids[right]));
    if (found == merges_.end() || found->second.new_id != top.new_id) continue;  // stale
    ids[top.pos] = top.new_id;
    alive[right] = 0;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) push(prev[top.pos]);
    push(top.pos);
  }
  size_t kept = 0;
  for (int i = 0; i < n; ++i) {
    if (alive[i]) ids[kept++] = ids[i];
  }
  ids.resize(kept);
}

void BpeModel::Encode(std::string_view word, std::vector<int64_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const int64_t id = vocab_.Id(word); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  InitialSymbols(word, &symbols);
  MergeAll(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

}  // namespace engine::tokenizer
