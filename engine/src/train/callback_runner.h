// The fault boundary around callbacks (failure catalogue F8).
//
// Every event goes to every live callback in order. An error returned or thrown by a callback is
// logged with the callback's name, the event and the step, then handled by its `on_error`:
// DISABLE (the default) stops calling it, WARN keeps calling it, FAIL_STAGE makes Dispatch return
// the error so the stage stops (after its last checkpoint, which stays valid).
//
// Thread safety: one thread at a time (the training thread).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/callback.h"
#include "engine/pipeline.pb.h"

namespace engine {

class CallbackRunner {
 public:
  void Add(std::string name, std::unique_ptr<Callback> callback,
           proto::CallbackRef::OnError on_error);

  // OK unless a FAIL_STAGE callback failed. Callbacks make their requests through `actions`.
  Status Dispatch(const Event& event, CallbackActions& actions);

  // Every callback's SaveState() that is not empty, keyed "<position>:<name>" (a callback that
  // throws is logged and left out).
  std::map<std::string, std::string> SaveStates() const;
  // Hands each callback what SaveStates() kept under its position and name; one that fails to
  // take it is logged and starts afresh.
  void RestoreStates(const std::map<std::string, std::string>& states);

  // Callbacks disabled after an error, by name.
  std::vector<std::string> Disabled() const;
  size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    std::string name;
    std::unique_ptr<Callback> callback;
    proto::CallbackRef::OnError on_error;
    bool disabled = false;
  };
  std::vector<Slot> slots_;
};

// The states of several runners (a stage's callbacks, then the pipeline's) in one map, keyed
// "<runner>/<position>:<name>", and back: each runner gets the entries under its own index.
std::map<std::string, std::string> SaveCallbackStates(const std::vector<CallbackRunner*>& runners);
void RestoreCallbackStates(const std::vector<CallbackRunner*>& runners,
                           const std::map<std::string, std::string>& states);

}  // namespace engine
