"""Mpipe's executor: run an evaluated schedule for real on torch.distributed.

Layout (each a module of its own):

* `model`      the MLLM (ViT encoder + decoder LM), config, synthetic data
* `partition`  the LLM split into the schedule's chunks
* `plan`       schedule -> per-rank ops, messages and their order (pure Python)
* `autograd_split`  B (input gradient) / W (weight gradient) / BW
* `runtime`    one rank executing its op list, timed
* `transport`  torch.distributed channels and collectives, or in-process threads
* `reference`  the single-process reference run and the gradient comparison
* `worker`     what each rank runs (a list of jobs); `launch` starts torchrun
"""
