"""`deepspeed.launcher.runner` as DeepSpeed's: the `deepspeed` command (`main`), which here is `dscpp launch` — the
same flags (--num_gpus, --num_nodes, --hostfile, --include/--exclude, --master_addr/--master_port, --launcher ...),
implemented by the C++ launcher (src/launcher/) — and the name of the file whose variables it exports to every node.

Hugging Face Accelerate imports DEEPSPEED_ENVIRONMENT_NAME and, for a multi-node job, writes its environment there
and runs `deepspeed --hostfile ...`; python/deepspeed-compat installs this module's `main` as that command.
"""
import sys

from dscpp import _cli

# Read by the launcher from the working directory and $HOME (src/launcher/remote_env.cpp), as DeepSpeed's.
DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"


def main(args=None):
    """`deepspeed ARGS...` = `dscpp launch ARGS...` (never returns: the launcher replaces this process)."""
    _cli.main(["launch"] + list(sys.argv[1:] if args is None else args))


if __name__ == "__main__":
    main()
