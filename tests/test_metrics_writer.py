"""TensorBoard events are written without importing PyTorch (tensorboardX would, for 1.6 s of every run's start)."""

import subprocess
import sys

from train_helpers import REPO, cpu_env

SCRIPT = """
import sys
from pathlib import Path
from bertjax.train.metrics import summary_writer

logdir = Path(sys.argv[1])
writer = summary_writer(logdir, purge_step=1)
for step, loss in ((1, 2.5), (2, 2.25)):
    writer.add_scalar("loss", loss, step)
writer.close()
print("torch imported:", "torch" in sys.modules)

# The events read back (TFRecord framing: length, its CRC, an Event proto, its CRC), and torch still imports
# afterwards (nothing is left hiding it).
import struct
from tensorboardX.proto.event_pb2 import Event

scalars = []
for path in logdir.iterdir():
    data = path.read_bytes()
    while data:
        (length,) = struct.unpack("<Q", data[:8])
        event = Event.FromString(data[12:12 + length])
        scalars += [(event.step, value.simple_value) for value in event.summary.value if value.tag == "loss"]
        data = data[12 + length + 4:]
print("loss:", sorted(scalars))
import torch
print("torch then:", torch.__name__)
"""


def test_summary_writer_writes_events_without_importing_torch(tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "tb")], env=cpu_env(), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "torch imported: False" in run.stdout
    assert "loss: [(1, 2.5), (2, 2.25)]" in run.stdout
    assert "torch then: torch" in run.stdout
