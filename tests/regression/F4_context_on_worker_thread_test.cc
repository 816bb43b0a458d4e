// F4: autocast state is thread-local; model code run on a worker thread lost it and failed with
// "mat1 and mat2 must have the same dtype". The engine's precision context is captured and entered
// on the worker thread.
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <thread>

#include "engine/precision_context.h"

namespace engine {
namespace {

// A model with a bf16 layer fed by f32 activations (an f32 norm before it, say): it only runs under
// autocast.
at::Tensor Forward(torch::nn::Linear& layer, const at::Tensor& x) { return layer->forward(x); }

TEST(F4ContextOnWorkerThreadTest, WithoutTheContextTheWorkerFails) {
  torch::nn::Linear layer(8, 4);
  layer->to(at::kBFloat16);
  at::Tensor x = at::randn({2, 8});
  auto scope = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter();
  EXPECT_NO_THROW(Forward(layer, x)) << "the main thread has autocast";
  std::string error;
  std::thread worker([&] {
    try {
      Forward(layer, x);
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    }
  });
  worker.join();
  EXPECT_THAT(error, ::testing::HasSubstr("mat1 and mat2 must have the same dtype"));
}

TEST(F4ContextOnWorkerThreadTest, TheCapturedContextGivesTheSameOutputBitForBit) {
  torch::nn::Linear layer(8, 4);
  layer->to(at::kBFloat16);
  at::Tensor x = at::randn({2, 8});
  auto scope = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter();
  at::Tensor main_output = Forward(layer, x);
  const PrecisionContext context = PrecisionContext::Capture();
  at::Tensor worker_output;
  std::thread worker([&] {
    auto worker_scope = context.Enter();
    worker_output = Forward(layer, x);
  });
  worker.join();
  ASSERT_TRUE(worker_output.defined());
  EXPECT_EQ(worker_output.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(worker_output, main_output));
}

}  // namespace
}  // namespace engine
