#include "train/step_scalars.h"

#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/record_function.h>

#include <limits>

namespace engine {

const char kReadStepScalarsScope[] = "engine::read_step_scalars";

std::vector<double> ReadStepScalars(const std::vector<at::Tensor>& scalars) {
  RECORD_FUNCTION(kReadStepScalarsScope, std::vector<c10::IValue>());
  at::Device device = at::kCPU;
  for (const at::Tensor& s : scalars) {
    if (s.defined()) device = s.device();
  }
  std::vector<at::Tensor> column;
  for (const at::Tensor& s : scalars) {
    column.push_back(s.defined() ? s.reshape({}).to(device, at::kDouble)
                                 : at::full({}, std::numeric_limits<double>::quiet_NaN(),
                                            at::TensorOptions().device(device).dtype(at::kDouble)));
  }
  const at::Tensor host = at::stack(column).to(at::kCPU).contiguous();
  const double* values = host.data_ptr<double>();
  return std::vector<double>(values, values + host.numel());
}

}  // namespace engine
