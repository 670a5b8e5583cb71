// Resolving the world (hostfile → include/exclude → num_nodes → num_gpus) and the exact per-rank environment.
#include <gtest/gtest.h>

#include "expect_error.h"
#include "temp_hostfile.h"
#include "../common/subprocess.h"
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "dscpp/launcher/world.h"

namespace dscpp::launcher {
namespace {

namespace fs = std::filesystem;

TEST(World, NoHostfileIsOneLocalProcess) {
  const World world = resolve_world(WorldOptions{});
  EXPECT_EQ(world.nodes, (Resources{{"localhost", {0}}}));
  EXPECT_EQ(world.master_addr, "127.0.0.1");
  EXPECT_EQ(world.master_port, 29500);
  EXPECT_FALSE(world.set_visible_devices);
  WorldOptions three;
  three.num_gpus = 3;
  EXPECT_EQ(resolve_world(three).nodes, (Resources{{"localhost", {0, 1, 2}}}));
  WorldOptions pick;
  pick.include = "localhost:1";  // DeepSpeed's way to pick one device without a hostfile
  const World picked = resolve_world(pick);
  EXPECT_EQ(picked.nodes, (Resources{{"localhost", {1}}}));
  EXPECT_TRUE(picked.set_visible_devices);
}

TEST(World, NumNodesThenNumGpus) {
  WorldOptions options;
  options.hostfile = write_hostfile("three", "w0 slots=4\nw1 slots=4\nw2 slots=2\n");
  EXPECT_EQ(resolve_world(options).world_size(), 10);
  options.num_nodes = 2;
  options.num_gpus = 3;  // replaces the hostfile's slots, as in DeepSpeed
  const World world = resolve_world(options);
  EXPECT_EQ(world.nodes, (Resources{{"w0", {0, 1, 2}}, {"w1", {0, 1, 2}}}));
  EXPECT_EQ(world.master_addr, "w0");
  EXPECT_EQ(world.world_size(), 6);
  EXPECT_EQ(world.first_rank(1), 3);
  options.master_addr = "10.1.2.3";
  options.master_port = 1234;
  EXPECT_EQ(resolve_world(options).master_addr, "10.1.2.3");
  EXPECT_EQ(resolve_world(options).master_port, 1234);
}

TEST(World, ExcludeThenRanksFollowHostfileOrder) {
  WorldOptions options;
  options.hostfile = write_hostfile("two", "w0 slots=2\nw1 slots=3\n");
  options.exclude = "w1:0";
  const World world = resolve_world(options);
  EXPECT_EQ(world.nodes, (Resources{{"w0", {0, 1}}, {"w1", {1, 2}}}));
  EXPECT_EQ(rank_env(world, 1, 0).at("RANK"), "2");
  EXPECT_EQ(rank_env(world, 1, 0).at("CUDA_VISIBLE_DEVICES"), "1,2");
}

TEST(World, ErrorsNameTheFlag) {
  const std::string hostfile = write_hostfile("pair", "w0 slots=2\nw1 slots=2\n");
  expect_error([&] {
    WorldOptions o;
    o.hostfile = hostfile;
    o.include = "w0";
    o.num_gpus = 1;
    resolve_world(o);
  }, "--num_nodes/--num_gpus cannot be combined with --include/--exclude");
  expect_error([&] {
    WorldOptions o;
    o.hostfile = hostfile;
    o.num_nodes = 3;
    resolve_world(o);
  }, "--num_nodes 3: the hostfile lists only 2 hosts");
  expect_error([] {
    WorldOptions o;
    o.num_nodes = 2;
    resolve_world(o);
  }, "--num_nodes 2 needs a --hostfile listing that many hosts");
  expect_error([] {
    WorldOptions o;
    o.num_gpus = 0;
    resolve_world(o);
  }, "--num_gpus 0: expected a positive count");
  expect_error([] {
    WorldOptions o;
    o.master_port = 70000;
    resolve_world(o);
  }, "--master_port 70000: expected 1..65535");
}

TEST(World, RankEnvForTwoNodesOfTwo) {
  WorldOptions options;
  options.hostfile = write_hostfile("loop", "localhost slots=2\n127.0.0.1 slots=2\n");
  options.master_port = 29555;
  const World world = resolve_world(options);
  ASSERT_EQ(world.world_size(), 4);
  for (int node = 0; node < 2; ++node) {
    for (int local = 0; local < 2; ++local) {
      const EnvMap expected{
          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29555"}, {"WORLD_SIZE", "4"},
          {"RANK", std::to_string(2 * node + local)}, {"LOCAL_RANK", std::to_string(local)}, {"LOCAL_SIZE", "2"},
          {"LOCAL_WORLD_SIZE", "2"}, {"CROSS_RANK", std::to_string(node)}, {"CROSS_SIZE", "2"},
          {"CUDA_VISIBLE_DEVICES", "0,1"}};
      EXPECT_EQ(rank_env(world, node, local), expected) << "node " << node << " local " << local;
    }
  }
  EXPECT_THROW(rank_env(world, 0, 2), std::out_of_range);
}

TEST(World, LoopbackHosts) {
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.0.1.1"));
  EXPECT_FALSE(is_loopback_host("worker-0"));
  EXPECT_FALSE(is_loopback_host("10.0.0.1"));
}

}  // namespace
}  // namespace dscpp::launcher
