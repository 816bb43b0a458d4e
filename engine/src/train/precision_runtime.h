// Carries out a precision plan for one stage: storage casts, f32 master weights, the autocast
// context and dynamic loss scaling, around the optimizer step (failure catalogue F4, F6, F7).
//
// The step path, in order:
//   ZeroGrad -> forward under context() -> backward of loss * loss_scale()
//   -> UnscaleAndFlag: every gradient is checked for non-finite values; a parameter without a
//      master is divided by the loss scale in place; a master's low-precision gradient is handed
//      to the optimizer as it is, with the factor still to apply (GradientFeed)
//   -> GradNormSquared where the stage clips; the flag and the norm are read with the loss in
//      one copy (train/step_scalars.h)
//   -> (skipped step, or ApplyClip, which also divides by a count read with the norm, and Step:
//      the optimizer on optimizer_parameters(), which unscales each fed gradient into the
//      master's f32 before any arithmetic and writes the updated master back into the
//      low-precision parameter) -> UpdateScale.
// UnscaleAndCheck and ClipGradients are the same with their reads done at once.
//
// The optimizer's arithmetic and state therefore always have the dtype of the weights it updates,
// the masters wherever they are kept (F6); with AdamW the cast, unscale, update and write-back are
// one fused pass (on the CPU, and on CUDA where LibTorch has it), and the checks and the norm cost
// no device read of their own.
//
// Thread safety: the training thread only. context() may be captured and entered on other threads.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/precision.h"
#include "engine/precision_context.h"
#include "engine/safetensors.h"
#include "engine/status.h"
#include "train/optimizer.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

// Who keeps the f32 masters of the tensors stored in low precision: the runtime (whole, for any
// optimizer), or the optimizer, which then gets the low-precision parameters themselves and keeps
// masters for what it updates (a sharded optimizer, for its part of them:
// train/sharded_optimizer.h).
enum class MasterHolder { kRuntime, kOptimizer };

class PrecisionRuntime {
 public:
  // Casts every tensor of `module` to its planned storage dtype where it is: before the module is
  // placed on a GPU, so that an f32 model trained in bf16 never holds both copies there.
  static Status CastStorage(const PrecisionPlan& plan, torch::nn::Module& module);
  // CastStorage (nothing left to do after an earlier call) on `module`, already on `device`;
  // checks the result with a fresh census, and makes f32 masters for trainable tensors stored in
  // low precision (unless `masters` leaves them to the optimizer).
  static StatusOr<std::unique_ptr<PrecisionRuntime>> Apply(
      const PrecisionPlan& plan, torch::nn::Module& module, c10::Device device,
      MasterHolder masters = MasterHolder::kRuntime);

  const PrecisionContext& context() const { return context_; }
  // The module's trainable parameters, in their storage dtype.
  const std::vector<NamedParameter>& parameters() const { return parameters_; }
  // What the optimizer updates: a parameter's f32 master where the runtime keeps one, else the
  // parameter.
  const std::vector<NamedParameter>& optimizer_parameters() const { return optimizer_parameters_; }
  MasterHolder master_holder() const { return master_holder_; }
  // Where the step's gradients are, when not on the parameters: sharded level 2 leaves each rank
  // only its parts of them, each the .grad() of `parts[k]` (a flat view of part of parameter
  // `parameter_of[k]`). The steps above then read, check, unscale, clip and feed those, one feed
  // per part, and GradNormSquared is this rank's share of the square (the caller sums it over the
  // ranks). Needs MasterHolder::kOptimizer.
  Status HoldGradientsIn(std::vector<at::Tensor> parts, std::vector<size_t> parameter_of);
  // Per optimizer parameter, the dtype of the master the optimizer keeps for it (MasterHolder::
  // kOptimizer), or Undefined.
  std::vector<at::ScalarType> OptimizerMasterDtypes() const;

  bool loss_scaling() const { return loss_scaling_.enabled; }
  double loss_scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t consecutive_skipped_steps() const { return consecutive_skips_; }

  void ZeroGrad();
  // Prepares the step's gradients for the optimizer, divided by loss_scale() (see above), and
  // returns a scalar on their device that is 0 when all of them are finite: queued work, read by
  // the caller together with the step's other scalars (one synchronisation per step).
  at::Tensor UnscaleAndFlag();
  // UnscaleAndFlag, read at once: whether every gradient is finite.
  bool UnscaleAndCheck();
  // After UnscaleAndFlag: the squared global L2 norm of the unscaled gradients, a scalar on their
  // device (queued, like the flag).
  at::Tensor GradNormSquared() const;
  // After a finite UnscaleAndFlag whose norm the caller read: divides the gradients by `divisor`
  // (the step's count of loss terms, read with the norm, where micro-batches or ranks were
  // weighted by theirs) and scales them so that their global L2 norm, `total_norm` after that
  // division, is at most `max_norm` (0: no clipping), in one pass.
  void ApplyClip(double total_norm, double max_norm, double divisor = 1.0);
  // GradNormSquared read at once, then ApplyClip; returns the norm before clipping (after the
  // division).
  double ClipGradients(double max_norm, double divisor = 1.0);
  // The optimizer's update at `lr` from the prepared gradients; the low-precision parameters hold
  // the updated masters afterwards.
  void Step(Optimizer& optimizer, double lr);
  // Gradients prepared by UnscaleAndCheck for the masters, one per optimizer parameter (or per
  // part, see HoldGradientsIn; an empty feed where the optimizer reads the .grad() itself).
  // Cleared by Step and ZeroGrad.
  const std::vector<GradientFeed>& feeds() const { return feeds_; }
  // Copies every master the runtime keeps into its low-precision parameter.
  void SyncParameters();
  // After a step: backs off on overflow (found_inf), grows after growth_interval clean steps.
  void UpdateScale(bool found_inf);

  // The invariant at the optimizer (F6), re-asserted after optimizer state is loaded: every state
  // tensor ("<parameter>.<slot>") has the dtype and shape of the weights it updates.
  Status VerifyOptimizerState(const Optimizer& optimizer) const;

  // "<parameter>.master" for each f32 master the runtime keeps, for checkpoints (none when the
  // optimizer keeps them: its State() holds them under the same names).
  safetensors::NamedTensors MasterTensors() const;

  // The dynamic loss scaler, exactly, for checkpoints a stage resumes from.
  struct ScalerState {
    double scale = 1;
    int64_t growth_tracker = 0;
    int64_t skipped_steps = 0;
    int64_t consecutive_skipped_steps = 0;
  };
  ScalerState scaler_state() const;

  // Puts back what MasterTensors() and scaler_state() saved: each master is copied into place (the
  // optimizer keeps updating the same tensors). Refuses a missing, extra or misshapen master (any
  // master, when the optimizer keeps them: they go to its LoadState).
  Status Restore(const safetensors::NamedTensors& masters, const ScalerState& scaler);

 private:
  PrecisionRuntime() = default;

  PrecisionContext context_;
  LossScalingPlan loss_scaling_;
  double scale_ = 1;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t consecutive_skips_ = 0;
  std::vector<NamedParameter> parameters_;
  std::vector<NamedParameter> optimizer_parameters_;
  // What holds the step's gradients: the parameters, or parts of them (HoldGradientsIn), and
  // the parameter each belongs to.
  std::vector<at::Tensor> holders_;
  std::vector<size_t> holder_parameter_;
  // Whether holder h's gradient goes to the optimizer through feeds_.
  bool Fed(size_t h) const { return h < feeds_.size() && feeds_[h].grad.defined(); }

  MasterHolder master_holder_ = MasterHolder::kRuntime;
  std::vector<at::ScalarType> master_dtypes_;  // per parameter; Undefined without a master
  // Whether parameter i is stored in low precision and updated through an f32 master, whoever
  // keeps it.
  bool HasMaster(size_t i) const { return master_dtypes_[i] != at::ScalarType::Undefined; }
  // Whether this runtime keeps that master (optimizer_parameters_[i] is then the master's copy).
  bool KeepsMaster(size_t i) const {
    return HasMaster(i) && master_holder_ == MasterHolder::kRuntime;
  }
  std::vector<GradientFeed> feeds_;
};

}  // namespace engine
