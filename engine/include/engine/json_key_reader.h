// Reading a JSON object from a file users bring (config.json, preprocessor_config.json) key by key,
// remembering which keys were read, so that every key is either implemented, known not to matter,
// or refused by name: the fidelity rule that an ignored key is a wrong model.
//
//   JsonKeyReader keys(json, "'dir/config.json'");
//   ENGINE_RETURN_IF_ERROR(keys.PositiveInt("patch_size", &config.patch_size));
//   const nlohmann::json& act = keys.Take("hidden_act");    // null when absent
//   ENGINE_RETURN_IF_ERROR(keys.RefuseUnread(neutral_keys, "is not supported by this engine"));
//
// Errors read "WHERE: 'key' what". Not thread-safe; the JSON must outlive the reader.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/status.h"

namespace engine {

class JsonKeyReader {
 public:
  JsonKeyReader(const nlohmann::json& json, std::string where)
      : json_(json), where_(std::move(where)) {}

  // The key's value, marked as read; null when absent.
  const nlohmann::json& Take(const std::string& key) {
    static const nlohmann::json null;
    read_.insert(key);
    auto it = json_.find(key);
    return it == json_.end() ? null : *it;
  }
  void MarkRead(const std::string& key) { read_.insert(key); }

  Status Error(const std::string& key, const std::string& what) const {
    return InvalidArgumentError(where_ + ": '" + key + "' " + what);
  }

  // A positive integer into `out` when the key is there (`out` unchanged otherwise).
  Status PositiveInt(const std::string& key, int64_t* out) {
    const nlohmann::json& v = Take(key);
    if (v.is_null()) return Status::Ok();
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      return Error(key, "must be a positive integer, not " + v.dump());
    }
    *out = v.get<int64_t>();
    return Status::Ok();
  }

  // true or false into `out` when the key is there.
  Status Bool(const std::string& key, bool* out) {
    const nlohmann::json& v = Take(key);
    if (v.is_null()) return Status::Ok();
    if (!v.is_boolean()) return Error(key, "must be true or false, not " + v.dump());
    *out = v.get<bool>();
    return Status::Ok();
  }

  // The keys neither read nor `neutral`, in the object's order.
  std::vector<std::string> Unread(const std::set<std::string>& neutral) const {
    std::vector<std::string> unread;
    for (auto it = json_.begin(); it != json_.end(); ++it) {
      if (read_.count(it.key()) == 0 && neutral.count(it.key()) == 0) unread.push_back(it.key());
    }
    return unread;
  }

  // The first unread key (not `neutral`) as "WHERE: 'key' (value) <what>", naming the others.
  Status RefuseUnread(const std::set<std::string>& neutral, const std::string& what) const {
    const std::vector<std::string> unread = Unread(neutral);
    if (unread.empty()) return Status::Ok();
    std::string others;
    for (size_t i = 1; i < unread.size(); ++i) others += (i > 1 ? ", " : "") + unread[i];
    return Error(unread.front(), "(" + json_[unread.front()].dump() + ") " + what +
                                     (others.empty() ? "" : " (also unread: " + others + ")"));
  }

  const nlohmann::json& json() const { return json_; }
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& json_;
  std::string where_;
  std::set<std::string> read_;
};

}  // namespace engine
