"""Mpipe's executor: run an evaluated schedule for real on torch.distributed.

Three rooms (see docs/architecture.md):

* `runtime/`   torch: the model, its split into chunks, the per-rank plan,
               transport, the B/W autograd split, the reference run, jobs,
               `rank` (what each torchrun rank runs), `model_workload`
               (the model described as a core workload) and `models/` (the
               plug-in protocol, the HF adapters, `mpipe profile`)
* `service/`   the queue worker, `launch` (starts torchrun and watches it), the
               live timing stream, the parent guard, and `run_setup` (the one
               place a run's options are checked and turned into a job)
* `analysis/`  torch-free reading of measured runs: `calibrate`, `compare_run`
* `errors`     every executor error
"""
