// The command lines that start a job on other nodes: plain `ssh` per node, `srun`, `mpirun`. Built as argv vectors
// (and quoted strings for the remote shell) so tests check them without running ssh, srun or mpirun.
#pragma once

#include <string>
#include <vector>

#include "dscpp/launcher/world.h"

namespace dscpp::launcher {

// POSIX-shell quoting: the text unchanged when it has only safe characters, else in single quotes.
std::string shell_quote(const std::string& text);

// Each word shell-quoted, joined by spaces.
std::string shell_join(const std::vector<std::string>& words);

// `ssh -o BatchMode=yes HOST 'cd CWD && env K=V ... REMOTE_ARGV...'`: BatchMode fails fast instead of prompting
// for a password; `env` sets the exports for the remote launcher without a shell-specific `export`.
std::vector<std::string> ssh_command(const std::string& host, const std::string& cwd, const EnvMap& exports,
                                     const std::vector<std::string>& remote_argv);

// `srun -n W --nodes=N --ntasks-per-node=S [--nodelist=h1,h2] [EXTRA...] env MASTER_ADDR=.. MASTER_PORT=.. K=V..
// PROGRAM ARGS`: srun starts every rank; each finds its rank in SLURM_PROCID (read by comm/dist_env). `nodelist`
// is given only when the hosts came from a hostfile. Throws when nodes have different slot counts (srun needs one
// tasks-per-node).
std::vector<std::string> srun_command(const World& world, bool nodelist, const EnvMap& exports,
                                      const std::vector<std::string>& extra_args,
                                      const std::vector<std::string>& program);

// `mpirun -n W -hostfile HOSTFILE [EXTRA...] -x MASTER_ADDR=.. -x MASTER_PORT=.. -x K=V.. PROGRAM ARGS`: each rank
// finds its rank in OMPI_COMM_WORLD_RANK.
std::vector<std::string> mpirun_command(const World& world, const std::string& hostfile, const EnvMap& exports,
                                        const std::vector<std::string>& extra_args,
                                        const std::vector<std::string>& program);

}  // namespace dscpp::launcher
