// The world-size-1 Comm: collectives over one rank reduce to copies, so the engine's code path is the same
// whether it runs alone or under the launcher.
#include "dscpp/comm/comm.h"

namespace dscpp {
namespace {

class SingleProcessComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }

  Handle all_reduce(torch::Tensor&, ReduceOp) override { return {}; }

  Handle reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp) override {
    if (!output.is_same(input)) output.copy_(input.view_as(output));
    return {};
  }

  Handle all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    if (!output.is_same(input)) output.copy_(input.view_as(output));
    return {};
  }

  Handle broadcast(torch::Tensor&, int) override { return {}; }
  Handle all_to_all(torch::Tensor& output, const torch::Tensor& input) override {
    if (!output.is_same(input)) output.copy_(input.view_as(output));
    return {};
  }
  void barrier() override {}
  // One rank has no peer to pair with.
  Handle send(const torch::Tensor&, int peer, int) override { no_peer("send", peer); }
  Handle recv(torch::Tensor&, int peer, int) override { no_peer("recv", peer); }
  std::vector<int64_t> side_all_gather(const std::vector<int64_t>& values) override { return values; }
  std::shared_ptr<Comm> split(int color, int) override {
    if (color < 0) throw std::invalid_argument("split: color must be >= 0, got " + std::to_string(color));
    return std::make_shared<SingleProcessComm>();
  }

 private:
  [[noreturn]] static void no_peer(const char* op, int peer) {
    throw std::invalid_argument(std::string(op) + ": peer " + std::to_string(peer) +
                                " is not another rank of this comm (world size 1)");
  }
};

}  // namespace

std::shared_ptr<Comm> make_single_process_comm() { return std::make_shared<SingleProcessComm>(); }

}  // namespace dscpp
