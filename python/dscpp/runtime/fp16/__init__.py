"""deepspeed.runtime.fp16's names that user scripts import (the 1-bit optimizers, dscpp.runtime.fp16.onebit)."""
