#include "engine/status.h"

#include <gtest/gtest.h>

namespace engine {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError(std::to_string(x) + " is odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  ENGINE_ASSIGN_OR_RETURN(int half, Half(x));
  ENGINE_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

Status CheckPositive(int x) {
  if (x <= 0) return InvalidArgumentError("not positive");
  return Status::Ok();
}

Status CheckBoth(int a, int b) {
  ENGINE_RETURN_IF_ERROR(CheckPositive(a).WithContext("a"));
  ENGINE_RETURN_IF_ERROR(CheckPositive(b).WithContext("b"));
  return Status::Ok();
}

TEST(StatusTest, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s.code(), StatusCode::kOk);
}

TEST(StatusTest, ContextIsPrependedToErrorsOnly) {
  Status error = NotFoundError("no such file").WithContext("stage 'x' plugin 'y'");
  EXPECT_EQ(error.message(), "stage 'x' plugin 'y': no such file");
  EXPECT_EQ(error.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Status::Ok().WithContext("anything").ok());
  EXPECT_EQ(Status(StatusCode::kOk, "ignored").message(), "");
}

TEST(StatusTest, StatusOrCarriesValueOrError) {
  EXPECT_EQ(*Quarter(12), 3);
  StatusOr<int> odd = Quarter(6);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(), "3 is odd");
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, ReturnIfErrorStopsAtTheFirstError) {
  EXPECT_TRUE(CheckBoth(1, 2).ok());
  EXPECT_EQ(CheckBoth(1, -2).message(), "b: not positive");
  EXPECT_EQ(CheckBoth(-1, -2).message(), "a: not positive");
}

TEST(StatusTest, StatusOrWithContext) {
  StatusOr<int> r = StatusOr<int>(DataLossError("truncated")).WithContext("reading x");
  EXPECT_EQ(r.status().message(), "reading x: truncated");
  StatusOr<int> ok = StatusOr<int>(5).WithContext("reading x");
  EXPECT_EQ(*ok, 5);
}

TEST(StatusTest, CodeNames) {
  EXPECT_EQ(StatusCodeName(StatusCode::kDataLoss), "DATA_LOSS");
  EXPECT_EQ(StatusCodeName(StatusCode::kFailedPrecondition), "FAILED_PRECONDITION");
}

}  // namespace
}  // namespace engine
