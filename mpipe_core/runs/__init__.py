"""What a run names, torch-free: the registered models and their specs, the options a
queued run may carry and the backends it may run on.  The queue, the worker, the CLI
and the app check against these before anything is imported or launched."""
