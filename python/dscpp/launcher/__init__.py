"""`deepspeed.launcher`: the `deepspeed` command's module, over our launcher (`dscpp launch`)."""
