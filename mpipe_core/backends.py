"""The torch.distributed backends a schedule can run on.  Names only: the
executor implements them, storage records a run's, the CLI and the app offer
them; all take the list from here."""
BACKENDS = ("gloo", "nccl", "hccl")
