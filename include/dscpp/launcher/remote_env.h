// What a multi-node launch exports to the other nodes: the launcher's NCCL_*, UCX_* and TORCHELASTIC_* variables,
// then the KEY=VALUE lines of `.deepspeed_env` (DeepSpeed's convention for per-job environment on every node).
#pragma once

#include <string>

#include "dscpp/launcher/world.h"

namespace dscpp::launcher {

// Parses `.deepspeed_env` text: KEY=VALUE per line, split at the first '=', both sides trimmed (as DeepSpeed does);
// blank and `#` lines skipped. The value is taken literally (no shell unquoting). `source` names the file in errors:
// a line without '=' or with an empty key is an error naming source:line.
EnvMap parse_env_file(const std::string& text, const std::string& source);

// The exports for remote nodes, later entries overriding earlier: every NCCL_* / UCX_* / TORCHELASTIC_* of
// `launcher_env`, then $HOME/NAME, then CWD/NAME, where NAME is $DS_ENV_FILE or ".deepspeed_env" (an absolute
// $DS_ENV_FILE is read once). Missing files are skipped.
EnvMap remote_exports(const EnvMap& launcher_env, const std::string& cwd);

}  // namespace dscpp::launcher
