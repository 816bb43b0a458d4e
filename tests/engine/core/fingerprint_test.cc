#include "core/fingerprint.h"

#include <gtest/gtest.h>

#include "engine/hash.h"
#include "engine/pipeline.pb.h"

namespace engine {
namespace {

TEST(FingerprintTest, CanonicalTextIncludesDefaults) {
  proto::Schedule explicit_default;
  explicit_default.set_batch_size(32);
  EXPECT_EQ(CanonicalText(proto::Schedule()), CanonicalText(explicit_default));
  EXPECT_NE(CanonicalText(proto::Schedule()).find("batch_size:32;"), std::string::npos);
  proto::Schedule other;
  other.set_batch_size(16);
  EXPECT_NE(CanonicalText(other), CanonicalText(explicit_default));
}

TEST(FingerprintTest, OneofPrintsOnlyTheChosenField) {
  proto::Schedule epochs, steps;
  epochs.set_epochs(3);
  steps.set_max_steps(3);
  EXPECT_NE(CanonicalText(epochs), CanonicalText(steps));
  EXPECT_EQ(CanonicalText(proto::Schedule()).find("epochs"), std::string::npos);
}

TEST(FingerprintTest, AnyPrintsItsTypeOnly) {
  proto::PluginRef ref;
  ref.set_plugin("x");
  ref.mutable_options()->set_type_url("type.googleapis.com/a.B");
  ref.mutable_options()->set_value("bytes that need not be canonical");
  EXPECT_NE(CanonicalText(ref).find("{type.googleapis.com/a.B}"), std::string::npos);
  EXPECT_EQ(CanonicalText(ref).find("bytes"), std::string::npos);
}

TEST(HashTest, Fnv1a64KnownValues) {
  EXPECT_EQ(Fnv1a64Hex(""), "cbf29ce484222325");
  EXPECT_EQ(Fnv1a64Hex("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(Fnv1a64Hex("foobar"), "85944171f73967e8");
}

}  // namespace
}  // namespace engine
