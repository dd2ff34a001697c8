"""The tp collective timer (`executor/parallel/collective_timer.py`): while an op is
timed, a functional collective on the tp group is one tp_comm row with the op's
chunk; one on another group (cp's), or outside an op, is not timed.  Run in a
process of its own on torch's fake process group (4 "ranks", a tp x cp mesh;
collectives return at once), since it creates a process group."""
import json
import subprocess
import sys

SCRIPT = r"""
import json, types
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed import _functional_collectives as funcol
from torch.distributed.tensor import DTensor, Replicate, Shard
from executor.parallel.collective_timer import tp_collective_timer

mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
timer = tp_collective_timer(mesh["tp"])
x = torch.ones(4, 8)
out = {}
funcol.all_reduce(x, "sum", mesh["tp"].get_group())            # no op running: not timed
out["outside"] = len(timer.take_rows())
with timer.timing(types.SimpleNamespace(chunk=3)):
    funcol.all_reduce(x, "sum", mesh["tp"].get_group())        # the tp group: timed
    funcol.all_gather_single(x, 0, mesh["cp"].get_group())     # cp's group: not ours
    d = DTensor.from_local(x, mesh["tp"], [Shard(0)], run_check=False)
    d.redistribute(mesh["tp"], [Replicate()]).to_local()       # DTensor's own all-gather
rows = timer.take_rows()
out["kinds"] = sorted({r[0] for r in rows})
out["chunks"] = sorted({r[1] for r in rows})
out["count"] = len(rows)
out["ordered"] = all(r[3] >= r[2] for r in rows)
print(json.dumps(out))
dist.destroy_process_group()
"""


def test_only_the_tp_groups_collectives_inside_an_op_become_rows():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"outside": 0, "kinds": ["tp_comm"], "chunks": [3], "count": 2, "ordered": True}
