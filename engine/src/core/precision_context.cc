#include "engine/precision_context.h"

#include "engine/dtype.h"
#include "engine/torch_compat.h"

namespace engine {

PrecisionContext PrecisionContext::Autocast(c10::DeviceType device_type, c10::ScalarType dtype) {
  PrecisionContext context;
  if (device_type == c10::DeviceType::CUDA) {
    context.cuda_enabled_ = true;
    context.cuda_dtype_ = dtype;
  } else {
    context.cpu_enabled_ = true;
    context.cpu_dtype_ = dtype;
  }
  return context;
}

PrecisionContext PrecisionContext::Capture() {
  PrecisionContext context;
  context.cpu_enabled_ = compat::AutocastEnabled(c10::DeviceType::CPU);
  context.cpu_dtype_ = compat::AutocastDtype(c10::DeviceType::CPU);
  context.cuda_enabled_ = compat::AutocastEnabled(c10::DeviceType::CUDA);
  context.cuda_dtype_ = compat::AutocastDtype(c10::DeviceType::CUDA);
  return context;
}

PrecisionContext::Scope PrecisionContext::Enter() const { return Scope(*this); }

PrecisionContext::Scope::Scope(const PrecisionContext& context) {
  previous_cpu_enabled_ = compat::AutocastEnabled(c10::DeviceType::CPU);
  previous_cpu_dtype_ = compat::AutocastDtype(c10::DeviceType::CPU);
  previous_cuda_enabled_ = compat::AutocastEnabled(c10::DeviceType::CUDA);
  previous_cuda_dtype_ = compat::AutocastDtype(c10::DeviceType::CUDA);
  // Set the dtypes first: a refused dtype throws before anything changed.
  if (context.cpu_enabled_) compat::SetAutocastDtype(c10::DeviceType::CPU, context.cpu_dtype_);
  if (context.cuda_enabled_) compat::SetAutocastDtype(c10::DeviceType::CUDA, context.cuda_dtype_);
  compat::SetAutocastEnabled(c10::DeviceType::CPU, context.cpu_enabled_);
  compat::SetAutocastEnabled(c10::DeviceType::CUDA, context.cuda_enabled_);
  compat::IncrementAutocastNesting();
  active_ = true;
}

PrecisionContext::Scope::Scope(Scope&& other) noexcept
    : active_(other.active_),
      previous_cpu_enabled_(other.previous_cpu_enabled_),
      previous_cuda_enabled_(other.previous_cuda_enabled_),
      previous_cpu_dtype_(other.previous_cpu_dtype_),
      previous_cuda_dtype_(other.previous_cuda_dtype_) {
  other.active_ = false;
}

PrecisionContext::Scope::~Scope() {
  if (!active_) return;
  // Casts cached inside the region hold the weights as they were; the outermost exit drops them so
  // the next region sees the optimizer's updates.
  if (compat::DecrementAutocastNesting() == 0) compat::ClearAutocastCache();
  compat::SetAutocastEnabled(c10::DeviceType::CPU, previous_cpu_enabled_);
  compat::SetAutocastEnabled(c10::DeviceType::CUDA, previous_cuda_enabled_);
  try {
    compat::SetAutocastDtype(c10::DeviceType::CPU, previous_cpu_dtype_);
    compat::SetAutocastDtype(c10::DeviceType::CUDA, previous_cuda_dtype_);
  } catch (...) {
    // The previous dtypes were accepted before; nothing to restore otherwise.
  }
}

std::string PrecisionContext::ToString() const {
  std::string out;
  if (cpu_enabled_) out = "autocast cpu " + std::string(DtypeShortName(cpu_dtype_));
  if (cuda_enabled_) {
    if (!out.empty()) out += ", ";
    out += "autocast cuda " + std::string(DtypeShortName(cuda_dtype_));
  }
  return out.empty() ? "none" : out;
}

}  // namespace engine
