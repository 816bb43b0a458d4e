// The fused cross-entropy rows against the ATen expressions the chunked head loss used: loss terms,
// argmax and the scaled gradient, for f32, bf16 and f16 logits, vocabularies that are not a
// multiple of the vector width, and rows with NaN and infinities.
#include "engine_kernels/cross_entropy_rows.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace engine::kernels {
namespace {

struct Reference {
  at::Tensor loss, argmax, gradient;  // loss and gradient in f32
};

// What lm_head_loss.cc computed with ATen (logits scored in f32).
Reference AtenReference(const at::Tensor& logits, const at::Tensor& targets, float scale) {
  const at::Tensor x = logits.to(at::kFloat);
  const at::Tensor index = targets.unsqueeze(1);
  const at::Tensor lse = at::logsumexp(x, -1, /*keepdim=*/true);
  Reference r;
  r.loss = (lse - x.gather(1, index)).squeeze(1);
  r.argmax = x.argmax(-1);
  at::Tensor g = (x - lse).exp_();
  g.scatter_add_(1, index, at::full({x.size(0), 1}, -1.0f));
  r.gradient = g.mul_(scale);
  return r;
}

// |a - b| <= atol + rtol |b| everywhere both are finite, and NaN and infinities in the same places.
void ExpectClose(const at::Tensor& got, const at::Tensor& want, double rtol, double atol,
                 const std::string& what) {
  const at::Tensor a = got.to(at::kDouble), b = want.to(at::kDouble);
  EXPECT_TRUE(at::equal(a.isnan(), b.isnan())) << what << ": NaN elsewhere";
  EXPECT_TRUE(at::equal(a.isinf(), b.isinf())) << what << ": infinities elsewhere";
  const at::Tensor finite = b.isfinite();
  const at::Tensor excess = ((a - b).abs() - (b.abs() * rtol + atol)).masked_select(finite);
  if (excess.numel() > 0) {
    EXPECT_LE(excess.max().item<double>(), 0.0) << what;
  }
}

TEST(CrossEntropyRowsTest, LossArgmaxAndGradientAreAtensInEveryDtype) {
  at::manual_seed(31);
  for (int64_t vocab : {1, 7, 301, 20011}) {
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor logits = (at::randn({5, vocab}) * 4).to(dtype);
      const at::Tensor targets = at::randint(0, vocab, {5}, at::kLong);
      const Reference want = AtenReference(logits, targets, 0.25f);
      const std::string what = std::to_string(vocab) + " " + c10::toString(dtype);

      const CrossEntropyRowsResult scored = CrossEntropyRows(logits, targets, true, std::nullopt);
      ExpectClose(scored.loss, want.loss, 1e-6, 1e-5, what + " loss");
      EXPECT_TRUE(at::equal(scored.argmax, want.argmax)) << what;

      const at::Tensor gradient = logits.clone();
      const CrossEntropyRowsResult trained = CrossEntropyRows(gradient, targets, false, 0.25f);
      EXPECT_TRUE(at::equal(trained.loss, scored.loss)) << what;
      EXPECT_FALSE(trained.argmax.defined());
      EXPECT_EQ(gradient.scalar_type(), dtype);
      // f32: the log-sum-exp's last bits (a few ulp of a value near 10, summed in another order)
      // are a relative 1e-6 of every exponential, plus the exponentials' own 2 ulp; 16-bit: the
      // f32 value rounded once, so at most one step of the type apart.
      const double rtol = dtype == at::kFloat ? 1e-5 : dtype == at::kBFloat16 ? 1.0 / 128 : 1e-3;
      ExpectClose(gradient, want.gradient.to(dtype), rtol, 1e-7, what + " gradient");
    }
  }
}

TEST(CrossEntropyRowsTest, NonFiniteAndExtremeRowsGiveWhatAtenGives) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor logits = at::randn({7, 19});
  logits[0][3] = inf;     // +inf: loss NaN or inf, gradient NaN
  logits[1][4] = nan;     // NaN anywhere
  logits[2].fill_(-inf);  // nothing but -inf
  logits[3][5] = -inf;    // one -inf among finite values
  logits[4].mul_(1e4);    // exponentials that underflow to 0
  logits[5][0] = 3e38f;   // near the largest float
  logits[6].fill_(2.0f);  // ties: the first is the argmax
  const at::Tensor targets = at::tensor({3, 0, 1, 5, 2, 0, 4}, at::kLong);
  const Reference want = AtenReference(logits, targets, 1.0f);
  const at::Tensor gradient = logits.clone();
  const CrossEntropyRowsResult got = CrossEntropyRows(gradient, targets, true, 1.0f);
  ExpectClose(got.loss, want.loss, 1e-6, 1e-5, "loss");
  EXPECT_TRUE(at::equal(got.argmax, want.argmax)) << got.argmax << want.argmax;
  ExpectClose(gradient, want.gradient, 1e-6, 1e-7, "gradient");
}

TEST(CrossEntropyRowsTest, RefusesTargetsOutsideTheVocabularyAndOtherLayouts) {
  const at::Tensor logits = at::randn({2, 5});
  try {
    CrossEntropyRows(logits, at::tensor({1, 5}, at::kLong), false, std::nullopt);
    FAIL() << "a target of 5 among 5 classes";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 5 of row 1 is outside the vocabulary of 5"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(CrossEntropyRowsSupports(logits.t(), at::tensor({1, 2}, at::kLong)));
  EXPECT_FALSE(CrossEntropyRowsSupports(logits, at::tensor({1, 2}, at::kInt)));
  EXPECT_FALSE(CrossEntropyRowsSupports(logits.to(at::kDouble), at::tensor({1, 2}, at::kLong)));
}

}  // namespace
}  // namespace engine::kernels
