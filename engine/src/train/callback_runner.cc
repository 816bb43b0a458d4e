#include "train/callback_runner.h"

#include "core/guarded_call.h"
#include "core/logging.h"

namespace engine {

void CallbackRunner::Add(std::string name, std::unique_ptr<Callback> callback,
                         proto::CallbackRef::OnError on_error) {
  slots_.push_back({std::move(name), std::move(callback), on_error, false});
}

Status CallbackRunner::Dispatch(const Event& event, CallbackActions& actions) {
  for (Slot& slot : slots_) {
    if (slot.disabled) continue;
    const std::string context = "callback '" + slot.name + "' on " +
                                std::string(EventTypeName(event.type)) + " at step " +
                                std::to_string(event.step);
    Status status = GuardedCall(context, [&] { return slot.callback->OnEvent(event, actions); });
    if (status.ok()) continue;
    switch (slot.on_error) {
      case proto::CallbackRef::WARN:
        LOG(WARNING) << status.message() << " (on_error: WARN, it stays enabled)";
        break;
      case proto::CallbackRef::FAIL_STAGE:
        LOG(ERROR) << status.message() << " (on_error: FAIL_STAGE)";
        return status;
      case proto::CallbackRef::DISABLE:
      default:
        LOG(WARNING) << status.message()
                     << " (on_error: DISABLE, it will not be called again; training goes on)";
        slot.disabled = true;
        break;
    }
  }
  return Status::Ok();
}

std::map<std::string, std::string> CallbackRunner::SaveStates() const {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    std::string state;
    const Status status = GuardedCall("callback '" + slot.name + "' saving its state", [&] {
      state = slot.callback->SaveState();
      return Status::Ok();
    });
    if (!status.ok()) {
      LOG(WARNING) << status.message() << "; the checkpoint goes without it";
    } else if (!state.empty()) {
      out[std::to_string(i) + ":" + slot.name] = state;
    }
  }
  return out;
}

void CallbackRunner::RestoreStates(const std::map<std::string, std::string>& states) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    auto it = states.find(std::to_string(i) + ":" + slot.name);
    if (it == states.end()) continue;
    const Status status = GuardedCall("callback '" + slot.name + "' restoring its state",
                                      [&] { return slot.callback->RestoreState(it->second); });
    if (!status.ok()) LOG(WARNING) << status.message() << "; it starts afresh";
  }
}

std::map<std::string, std::string> SaveCallbackStates(const std::vector<CallbackRunner*>& runners) {
  std::map<std::string, std::string> out;
  for (size_t r = 0; r < runners.size(); ++r) {
    for (const auto& [key, state] : runners[r]->SaveStates()) {
      out[std::to_string(r) + "/" + key] = state;
    }
  }
  return out;
}

void RestoreCallbackStates(const std::vector<CallbackRunner*>& runners,
                           const std::map<std::string, std::string>& states) {
  for (size_t r = 0; r < runners.size(); ++r) {
    const std::string prefix = std::to_string(r) + "/";
    std::map<std::string, std::string> mine;
    for (const auto& [key, state] : states) {
      if (key.rfind(prefix, 0) == 0) mine[key.substr(prefix.size())] = state;
    }
    if (!mine.empty()) runners[r]->RestoreStates(mine);
  }
}

std::vector<std::string> CallbackRunner::Disabled() const {
  std::vector<std::string> out;
  for (const Slot& slot : slots_) {
    if (slot.disabled) out.push_back(slot.name);
  }
  return out;
}

}  // namespace engine
