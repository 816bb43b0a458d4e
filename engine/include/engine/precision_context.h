// The precision context: the autocast state (device type, enabled, dtype) as an object that can be
// captured on one thread and entered on another (failure catalogue F4).
//
// LibTorch keeps autocast state per thread, so model code run on a thread the engine (or a plugin)
// starts would otherwise run without it, and fail with "mat1 and mat2 must have the same dtype" or
// silently compute in another dtype. The engine enters the stage's context around every forward
// pass; code that starts its own threads captures it and enters it there:
//
//   engine::PrecisionContext context = engine::PrecisionContext::Capture();
//   std::thread worker([&] {
//     auto scope = context.Enter();
//     output = model.Forward(batch);
//   });
//
// A model that must run part of itself in f32 enters PrecisionContext::None() around that part.
//
// Thread safety: a context is an immutable value. A Scope belongs to the thread that made it and
// restores that thread's previous state when destroyed; scopes nest.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace engine {

class PrecisionContext {
 public:
  // No autocast on any device.
  static PrecisionContext None() { return PrecisionContext(); }
  // Autocast to `dtype` for operations on `device_type` (kCPU or kCUDA).
  static PrecisionContext Autocast(c10::DeviceType device_type, c10::ScalarType dtype);
  // The calling thread's current state, CPU and CUDA.
  static PrecisionContext Capture();

  class [[nodiscard]] Scope {
   public:
    ~Scope();
    Scope(Scope&& other) noexcept;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;

   private:
    friend class PrecisionContext;
    explicit Scope(const PrecisionContext& context);
    bool active_ = false;
    bool previous_cpu_enabled_ = false;
    bool previous_cuda_enabled_ = false;
    c10::ScalarType previous_cpu_dtype_ = c10::ScalarType::BFloat16;
    c10::ScalarType previous_cuda_dtype_ = c10::ScalarType::Half;
  };

  // Sets this context on the calling thread until the returned scope ends. Throws c10::Error when
  // this LibTorch's autocast cannot target the dtype on that device type.
  Scope Enter() const;

  bool cpu_enabled() const { return cpu_enabled_; }
  bool cuda_enabled() const { return cuda_enabled_; }
  c10::ScalarType cpu_dtype() const { return cpu_dtype_; }
  c10::ScalarType cuda_dtype() const { return cuda_dtype_; }
  // "none", "autocast cpu bf16", ...
  std::string ToString() const;

  friend bool operator==(const PrecisionContext& a, const PrecisionContext& b) {
    return a.cpu_enabled_ == b.cpu_enabled_ && a.cuda_enabled_ == b.cuda_enabled_ &&
           (!a.cpu_enabled_ || a.cpu_dtype_ == b.cpu_dtype_) &&
           (!a.cuda_enabled_ || a.cuda_dtype_ == b.cuda_dtype_);
  }

 private:
  bool cpu_enabled_ = false;
  bool cuda_enabled_ = false;
  c10::ScalarType cpu_dtype_ = c10::ScalarType::BFloat16;
  c10::ScalarType cuda_dtype_ = c10::ScalarType::Half;
};

}  // namespace engine
