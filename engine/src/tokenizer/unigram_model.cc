#include "tokenizer/unigram_model.h"

#include <algorithm>
#include <limits>

#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

// How far below the lowest piece score an unknown character scores (SentencePiece's kUnkPenalty).
constexpr double kUnknownPenalty = 10.0;

uint64_t EdgeKey(int32_t node, unsigned char byte) {
  return (static_cast<uint64_t>(node) << 8) | byte;
}

}  // namespace

StatusOr<std::unique_ptr<Model>> UnigramModel::Parse(const Json& json, const std::string& path) {
  auto model = std::unique_ptr<UnigramModel>(new UnigramModel());
  ENGINE_ASSIGN_OR_RETURN(const Json* vocab, ArrayField(json, "vocab", path));
  if (vocab->empty() || vocab->size() > INT32_MAX) {
    return FieldError(path + ".vocab", "must hold between 1 and 2^31 - 1 pieces");
  }
  model->nodes_.emplace_back();
  double lowest = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < vocab->size(); ++i) {
    const Json& entry = (*vocab)[i];
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() || !entry[1].is_number()) {
      return FieldError(path + ".vocab[" + std::to_string(i) + "]", "must be [\"piece\", score]");
    }
    const auto id = static_cast<int32_t>(i);
    const std::string piece = entry[0].get<std::string>();
    const double score = entry[1].get<double>();
    model->vocab_.Add(piece, id);
    model->scores_.push_back(score);
    model->AddToTrie(piece);
    lowest = std::min(lowest, score);
  }
  model->unk_score_ = lowest - kUnknownPenalty;
  ENGINE_ASSIGN_OR_RETURN(const int64_t unk_id, IntField(json, "unk_id", path, -1));
  if (unk_id < 0 || unk_id >= model->size()) {
    return FieldError(path + ".unk_id",
                      unk_id < 0 ? "is missing: a Unigram model needs one for the characters its "
                                   "pieces do not cover (tokenizers fails on such text)"
                                 : "is not an id of the vocabulary");
  }
  model->unk_id_ = static_cast<int32_t>(unk_id);
  ENGINE_ASSIGN_OR_RETURN(model->byte_fallback_, BoolField(json, "byte_fallback", path, false));
  model->byte_ids_ = model->vocab_.ByteIds();
  return std::unique_ptr<Model>(std::move(model));
}

void UnigramModel::AddToTrie(const std::string& piece) {
  if (piece.empty()) return;
  int32_t node = 0;
  for (char c : piece) {
    const auto [edge, added] =
        edges_.emplace(EdgeKey(node, static_cast<unsigned char>(c)), nodes_.size());
    if (added) nodes_.emplace_back();
    node = edge->second;
  }
  // The vocabulary's map keeps the last id of a repeated piece; so does the trie.
  nodes_[node].piece = static_cast<int32_t>(vocab_.Id(piece));
}

std::vector<UnigramModel::Cut> UnigramModel::BestPath(std::string_view word) const {
  struct Best {
    double score = 0;
    int64_t begin = -1;  // -1: no path ends here yet
    int32_t id = -1;
  };
  const auto offer = [](Best* best, double score, size_t begin, int32_t id) {
    // Strictly better only: on a tie the path found first stays, as in tokenizers.
    if (best->begin >= 0 && score <= best->score) return;
    *best = {score, static_cast<int64_t>(begin), id};
  };
  std::vector<Best> best(word.size() + 1);
  for (size_t start = 0; start < word.size();) {
    size_t char_end = start;
    NextCodePoint(word, &char_end);
    const double base = best[start].score;
    bool covered = false;
    int32_t node = 0;
    for (size_t pos = start; pos < word.size(); ++pos) {
      const auto edge = edges_.find(EdgeKey(node, static_cast<unsigned char>(word[pos])));
      if (edge == edges_.end()) break;
      node = edge->second;
      const int32_t id = nodes_[node].piece;
      if (id < 0) continue;
      offer(&best[pos + 1], base + scores_[id], start, id);
      covered = covered || pos + 1 == char_end;
    }
    if (!covered) offer(&best[char_end], base + unk_score_, start, unk_id_);
    start = char_end;
  }
  std::vector<Cut> cuts;
  for (size_t end = word.size(); end > 0;) {
    const Best& node = best[end];
    const auto begin = static_cast<size_t>(node.begin);
    if (node.id == unk_id_ && !cuts.empty() && cuts.back().id == unk_id_) {
      cuts.back().begin = begin;  // neighbouring unknowns fuse
    } else {
      cuts.push_back({begin, end, node.id});
    }
    end = begin;
  }
  std::reverse(cuts.begin(), cuts.end());
  return cuts;
}

void UnigramModel::AppendIds(std::string_view text, int32_t id, std::vector<int64_t>* ids) const {
  if (id != unk_id_) {
    ids->push_back(id);
    return;
  }
  // A fused unknown stretch may still be a piece; else its bytes, when all are tokens; else unk.
  if (const int64_t piece = vocab_.Id(text); piece >= 0) {
    ids->push_back(piece);
    return;
  }
  if (byte_fallback_ && std::all_of(text.begin(), text.end(), [&](char byte) {
        return byte_ids_[static_cast<unsigned char>(byte)] >= 0;
      })) {
    for (char byte : text) ids->push_back(byte_ids_[static_cast<unsigned char>(byte)]);
    return;
  }
  ids->push_back(unk_id_);
}

void UnigramModel::Encode(std::string_view word, std::vector<int64_t>* ids) const {
  for (const Cut& cut : BestPath(word)) {
    AppendIds(word.substr(cut.begin, cut.end - cut.begin), cut.id, ids);
  }
}

}  // namespace engine::tokenizer
