// The tiled loss (dscpp::tiled_cross_entropy, ALST's): its value and gradients equal the untiled cross-entropy's for
// tiles that do and do not divide the positions, with a padded vocabulary; bad shapes are named; and gpt-train
// --tiled_loss gives the untiled run's losses, also with the sequence split over 2 ranks.
#include <gtest/gtest.h>

#include "../common/gpt_train_runs.h"
#include "dscpp/sequence/tiled_loss.h"

namespace dscpp::testing {
namespace {

struct Case {
  torch::Tensor hidden, head, targets;
};

Case make_case(int64_t n, int64_t vocab) {
  torch::manual_seed(3);
  return {torch::randn({n, 16}).requires_grad_(), torch::randn({50, 16}).requires_grad_(),
          torch::randint(0, vocab, {n}, torch::kLong)};
}

TEST(TiledLoss, EqualsTheUntiledLossAndGradients) {
  const int64_t n = 37, vocab = 45;  // 5 of the head's 50 rows are padding: no probability
  Case plain = make_case(n, vocab);
  const auto logits = plain.hidden.matmul(plain.head.t()).narrow(-1, 0, vocab).to(torch::kFloat);
  const auto want = torch::nn::functional::cross_entropy(logits, plain.targets);
  want.backward();
  for (int64_t tile : {1, 8, 37, 64}) {
    SCOPED_TRACE("tile " + std::to_string(tile));
    Case tiled = make_case(n, vocab);
    const auto got = tiled_cross_entropy(tiled.hidden, tiled.head, tiled.targets, tile, vocab);
    got.backward();
    EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-6);
    EXPECT_LT((tiled.hidden.grad() - plain.hidden.grad()).abs().max().item<double>(), 1e-6);
    EXPECT_LT((tiled.head.grad() - plain.head.grad()).abs().max().item<double>(), 1e-6);
    EXPECT_EQ(tiled.head.grad().narrow(0, vocab, 5).abs().max().item<double>(), 0.0);  // padding rows untouched
  }
}

// bf16: the head's gradient summed over tiles in fp32 and rounded once, as the untiled product's. 512 one-position
// tiles summed in bf16 would be 1.6e-2 of the gradient's scale off (measured with torch for these draws); in fp32, 4e-3.
TEST(TiledLoss, HalfPrecisionHeadGradientIsRoundedOnce) {
  Case plain = make_case(512, 50);
  auto hidden = plain.hidden.detach().to(torch::kBFloat16).requires_grad_();
  auto head = plain.head.detach().to(torch::kBFloat16).requires_grad_();
  const auto logits = hidden.matmul(head.t()).to(torch::kFloat);
  torch::nn::functional::cross_entropy(logits, plain.targets).backward();
  auto hidden2 = plain.hidden.detach().to(torch::kBFloat16).requires_grad_();
  auto head2 = plain.head.detach().to(torch::kBFloat16).requires_grad_();
  tiled_cross_entropy(hidden2, head2, plain.targets, 1).backward();
  EXPECT_EQ(head2.grad().scalar_type(), torch::kBFloat16);
  const double scale = head.grad().abs().max().item<double>();
  EXPECT_LT((head2.grad() - head.grad()).abs().max().item<double>(), 8e-3 * scale);
}

TEST(TiledLoss, NamesBadShapes) {
  const Case c = make_case(4, 50);
  try {
    tiled_cross_entropy(c.hidden, c.head.narrow(1, 0, 8), c.targets, 2);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hidden (4, 16), head (50, 8)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tiled_cross_entropy(c.hidden, c.head, c.targets, 0), std::invalid_argument);
  EXPECT_ANY_THROW(tiled_cross_entropy(c.hidden, c.head, torch::full({4}, -100, torch::kLong), 2));  // no ignore_index
  EXPECT_THROW(tiled_cross_entropy(c.hidden, c.head, c.targets, 2, 51), std::invalid_argument);
}

TEST(TiledLoss, GptTrainGivesTheUntiledLosses) {
  const auto whole = gpt_train_adamw(1, 0, "");
  expect_same_trajectory(gpt_train_adamw(1, 0, "--tiled_loss 48"), whole);  // 48 does not divide 4 x 128 positions
  expect_same_trajectory(gpt_train_adamw(2, 0, "--sequence_parallel 2 --tiled_loss 32"), whole);
}

}  // namespace
}  // namespace dscpp::testing
