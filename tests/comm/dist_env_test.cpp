// DistEnv: each environment source (torchrun, SLURM, OpenMPI, none), its defaults, and every error naming the variable.
#include <gtest/gtest.h>

#include <stdexcept>

#include "dscpp/comm/dist_env.h"

namespace dscpp {
namespace {

using Env = std::map<std::string, std::string>;

// The message of the std::invalid_argument that from_map throws, or "" when it does not throw.
std::string error_of(const Env& env) {
  try {
    DistEnv::from_map(env);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(DistEnvTest, NothingSetIsOneProcess) {
  const auto e = DistEnv::from_map({});
  EXPECT_EQ(e.source, "default");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.timeout, std::chrono::minutes(30));
}

TEST(DistEnvTest, TorchrunFull) {
  const auto e = DistEnv::from_map({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                    {"LOCAL_WORLD_SIZE", "4"}, {"CROSS_RANK", "1"}, {"CROSS_SIZE", "2"},
                                    {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"},
                                    {"DEEPSPEED_TIMEOUT", "0.05"}, {"GLOO_SOCKET_IFNAME", "eth0"}});
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 4);
  EXPECT_EQ(e.cross_rank, 1);
  EXPECT_EQ(e.cross_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.timeout, std::chrono::milliseconds(3000));
  EXPECT_EQ(e.gloo_socket_ifname, "eth0");
}

TEST(DistEnvTest, TorchrunDefaultsOnOneNode) {
  const auto e = DistEnv::from_map({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_size, 3);
  EXPECT_EQ(e.cross_rank, 0);
  EXPECT_EQ(e.cross_size, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(DistEnvTest, TorchrunDerivesNodesFromLocalSize) {
  const auto e = DistEnv::from_map({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"LOCAL_SIZE", "4"},
                                    {"MASTER_ADDR", "h0"}});
  EXPECT_EQ(e.local_size, 4);
  EXPECT_EQ(e.cross_rank, 1);
  EXPECT_EQ(e.cross_size, 2);
}

TEST(DistEnvTest, TorchrunErrorsNameTheVariable) {
  EXPECT_EQ(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
            "RANK='2' is invalid: expected an integer in 0..1 (WORLD_SIZE=2)");
  EXPECT_EQ(error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}), "RANK='x1' is invalid: expected an integer");
  EXPECT_EQ(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2.0"}}), "WORLD_SIZE='2.0' is invalid: expected an integer");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE='0' is invalid: expected an integer >= 1");
  EXPECT_EQ(error_of({{"RANK", "0"}}), "WORLD_SIZE is not set but RANK is set");
  EXPECT_EQ(error_of({{"WORLD_SIZE", "2"}}), "RANK is not set but WORLD_SIZE is set");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
            "MASTER_PORT='70000' is invalid: expected a TCP port in 1..65535");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}),
            "MASTER_PORT='0' is invalid: expected a TCP port in 1..65535");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "80a"}}),
            "MASTER_PORT='80a' is invalid: expected an integer");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
            "LOCAL_RANK='2' is invalid: expected an integer in 0..1 (LOCAL_WORLD_SIZE=2)");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}}),
            "MASTER_ADDR is not set but the job spans 2 nodes (WORLD_SIZE=4, local size 2); set it to rank 0's "
            "address");
  EXPECT_EQ(error_of({{"DEEPSPEED_TIMEOUT", "soon"}}),
            "DEEPSPEED_TIMEOUT='soon' is invalid: expected a positive number of minutes, e.g. 30 or 0.5");
  EXPECT_EQ(error_of({{"DEEPSPEED_TIMEOUT", "-1"}}),
            "DEEPSPEED_TIMEOUT='-1' is invalid: expected a positive number of minutes, e.g. 30 or 0.5");
}

// torchrun's static rendezvous serves the store itself and says so; the attempt number keys each restart apart.
TEST(DistEnvTest, TorchrunAgentStore) {
  const Env job = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29400"}};
  EXPECT_FALSE(DistEnv::from_map(job).agent_store);
  Env agent = job;
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  agent["TORCHELASTIC_RESTART_COUNT"] = "2";
  const auto e = DistEnv::from_map(agent);
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.restart_count, 2);
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // c10d rendezvous: rank 0 hosts the store, as in torch
  EXPECT_FALSE(DistEnv::from_map(agent).agent_store);
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  agent.erase("TORCHELASTIC_RESTART_COUNT");
  EXPECT_EQ(error_of(agent), "TORCHELASTIC_RESTART_COUNT is not set but TORCHELASTIC_USE_AGENT_STORE=True");
  agent["TORCHELASTIC_RESTART_COUNT"] = "-1";
  EXPECT_EQ(error_of(agent), "TORCHELASTIC_RESTART_COUNT='-1' is invalid: expected an integer >= 0");
}

TEST(DistEnvTest, SlurmWithTasksPerNodeList) {
  // 3 nodes: 4, 4 and 3 tasks; this is task 9, the second on node 2.
  const auto e = DistEnv::from_map({{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "11"}, {"SLURM_LOCALID", "1"},
                                    {"SLURM_TASKS_PER_NODE", "4(x2),3"}, {"SLURM_NODEID", "2"},
                                    {"SLURM_NNODES", "3"}, {"SLURM_JOB_NODELIST", "gpu[07-09,12],login1"},
                                    {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}});
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 9);
  EXPECT_EQ(e.world_size, 11);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 3);
  EXPECT_EQ(e.cross_rank, 2);
  EXPECT_EQ(e.cross_size, 3);
  EXPECT_EQ(e.master_addr, "gpu07");
}

TEST(DistEnvTest, SlurmMasterSources) {
  Env base{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_NNODES", "2"}};
  Env env = base;
  env["SLURM_JOB_NODELIST"] = "a01,a02";
  EXPECT_EQ(DistEnv::from_map(env).master_addr, "a01");
  EXPECT_EQ(DistEnv::from_map(env).local_size, 2);
  env["MASTER_ADDR"] = "10.9.9.9";
  EXPECT_EQ(DistEnv::from_map(env).master_addr, "10.9.9.9");
  env = base;
  env["SLURM_LAUNCH_NODE_IPADDR"] = "10.1.1.1";
  EXPECT_EQ(DistEnv::from_map(env).master_addr, "10.1.1.1");
  EXPECT_EQ(error_of(base),
            "MASTER_ADDR is not set but the job spans 2 nodes (SLURM_NTASKS=4, local size 2); set it to rank 0's "
            "address");
  // One node: loopback.
  const auto one = DistEnv::from_map({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(one.master_addr, "127.0.0.1");
  EXPECT_EQ(one.local_size, 2);
}

TEST(DistEnvTest, SlurmErrors) {
  EXPECT_EQ(error_of({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
            "SLURM_PROCID='4' is invalid: expected an integer in 0..3 (SLURM_NTASKS=4)");
  EXPECT_EQ(error_of({{"SLURM_PROCID", "0"}}), "SLURM_NPROCS is not set but SLURM_PROCID is set");
  EXPECT_EQ(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x2"},
                      {"SLURM_NNODES", "2"}, {"MASTER_ADDR", "h"}}),
            "SLURM_TASKS_PER_NODE='2(x2' is invalid: expected counts like '4' or '4(x2)', comma-separated");
  EXPECT_EQ(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},
                      {"SLURM_NODEID", "2"}, {"SLURM_NNODES", "2"}, {"MASTER_ADDR", "h"}}),
            "SLURM_NODEID='2' is invalid: expected a node index below the 2 nodes of SLURM_TASKS_PER_NODE='2(x2)'");
}

TEST(DistEnvTest, OpenMpi) {
  const auto e = DistEnv::from_map({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                    {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "4000"}});
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.cross_rank, 1);
  EXPECT_EQ(e.cross_size, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 4000);
  EXPECT_EQ(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
            "MASTER_ADDR is not set but the job spans 2 nodes (OMPI_COMM_WORLD_SIZE=4, local size 2); set it to "
            "rank 0's address");
  EXPECT_EQ(error_of({{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
            "OMPI_COMM_WORLD_RANK='-1' is invalid: expected an integer in 0..3 (OMPI_COMM_WORLD_SIZE=4)");
}

TEST(DistEnvTest, TorchrunWinsOverSlurm) {
  const auto e = DistEnv::from_map({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 1);
}

}  // namespace
}  // namespace dscpp
