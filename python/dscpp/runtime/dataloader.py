"""DeepSpeed's RepeatingLoader (deepspeed.runtime.dataloader, re-exported by deepspeed.utils)."""


class RepeatingLoader:
    """Iterates `loader` forever: when it is exhausted, a new pass starts (a DataLoader with a sampler reshuffles
    then, as in a new epoch). Pipeline scripts hand it to engine.train_batch(data_iter=...)."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)  # an empty loader ends here too, with StopIteration
