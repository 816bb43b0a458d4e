#include "core/guarded_call.h"

#include <c10/util/Exception.h>

namespace engine {

std::string CurrentExceptionMessage() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

}  // namespace engine
