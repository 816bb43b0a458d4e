// NF4 codes behind engine::QuantizedWeight for the 4-bit matmul benchmarks (quant_bench on the CPU,
// nf4_cuda_bench with the codes on the GPU): what the nf4 quantizer's layers hold, without the
// plugin. Dequantizes where the codes are.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/linear.h"
#include "engine_kernels/nf4.h"

namespace engine::bench {

class Nf4BenchWeight : public QuantizedWeight {
 public:
  Nf4BenchWeight(kernels::Nf4Tensor q, c10::ScalarType compute)
      : q_(std::move(q)), compute_(compute) {}
  std::string format() const override { return "nf4"; }
  int64_t rows() const override { return q_.shape[0]; }
  int64_t cols() const override { return q_.shape[1]; }
  c10::ScalarType compute_dtype() const override { return compute_; }
  at::Tensor DequantizeRows(int64_t begin, int64_t end, c10::ScalarType dtype) const override {
    return kernels::DequantizeNf4Range(q_, begin * cols(), end * cols(), dtype)
        .view({end - begin, cols()});
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors() const override {
    return {{"weight", q_.packed}};
  }
  StatusOr<std::shared_ptr<QuantizedWeight>> QuantizeLike(const at::Tensor&) const override {
    return InternalError("not in the benchmark");
  }

 private:
  kernels::Nf4Tensor q_;
  c10::ScalarType compute_;
};

}  // namespace engine::bench
