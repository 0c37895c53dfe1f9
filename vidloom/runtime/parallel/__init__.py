"""Several devices: Ulysses sequence parallel and CFG-parallel over torch.distributed, one process per device.

    engine = launch_engine(model, card, checkpoint, device, dtype, deploy)   # or VideoGenerator(devices=...)
    outputs = engine.run(request)                                           # same interface as Engine

Files: plan (checks), comm (process groups), ulysses (sequence parallel), messages (the
protocol), rank (lockstep execution), worker (process entry), pool (spawn + supervise),
engine (ParallelEngine / ParallelRun), launch (spawned or torchrun).
"""
