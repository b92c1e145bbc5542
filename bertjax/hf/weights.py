"""Read and write the weight files of a Hugging Face checkpoint directory as {name: numpy array}.

Formats, in the order they are looked for: `model.safetensors`, a sharded safetensors index
(`model.safetensors.index.json`), then `pytorch_model.bin` / `pytorch_model.bin.index.json`. PyTorch files are
pickles, and unpickling a file can run code from it: torch's restricted unpickler (`weights_only=True`) has been
bypassed before. So they are read only when the caller opts in (`allow_pickle=True`, `--allow-pickle`), with a
warning, through `torch.load(weights_only=True)`; otherwise the error says how to convert them once.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable

import numpy as np
import safetensors.numpy

from bertjax.jsonl import json_type_name, read_json_file

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
PICKLED = (TORCH_BIN, TORCH_BIN_INDEX)

log = logging.getLogger(__name__)


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    try:
        return safetensors.numpy.load_file(path)
    except Exception as error:  # safetensors raises its own error types for truncated or corrupt headers
        raise ValueError(f"{path}: not a readable safetensors file ({error})") from error


def safetensors_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor a safetensors file holds, from its header alone (nothing is read)."""
    try:
        with safetensors.safe_open(path, framework="numpy") as file:
            return {name: tuple(file.get_slice(name).get_shape()) for name in file.keys()}
    except Exception as error:  # safetensors raises its own error types for truncated or corrupt headers
        raise ValueError(f"{path}: not a readable safetensors file ({error})") from error


def read_torch_bin(path: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as error:
        raise ValueError(f"{path} is a PyTorch pickle: reading it needs torch (the CPU build will do: pip install "
                         "torch --index-url https://download.pytorch.org/whl/cpu), which loads it "
                         "with weights_only=True; bertjax never unpickles a file any other way. "
                         "Convert it to safetensors, or install torch.") from error
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # weights_only refuses pickles holding anything but tensors and plain containers
        # Only torch's first line that says why: its advice to retry with weights_only=False is not for such files.
        reason = next((line.strip() for line in str(error).splitlines()
                       if line.strip().startswith(("Trying to load unsupported GLOBAL", "Unsupported global"))),
                      str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__).rstrip(".")
        raise ValueError(f"{path}: torch.load(weights_only=True) refused or failed to read it: {reason}. A "
                         "checkpoint holds tensors only; a file that needs more may run code when unpickled") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a flat {{name: tensor}} state dict")
    # float32 holds bfloat16/float16 values exactly; numpy has no bfloat16 of its own.
    return {name: (t.detach().float() if t.is_floating_point() else t.detach()).numpy() for name, t in state.items()}


def _read_index(directory: str, index_name: str, read_shard: Callable[[str], dict]) -> dict[str, np.ndarray]:
    index_path = os.path.join(directory, index_name)
    weight_map = read_json_file(index_path).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index_path}: not a checkpoint index: 'weight_map' must map tensor names to shard file "
                         f"names, got {json_type_name(weight_map)}")
    for shard in weight_map.values():  # before the set and sort below, which a list or a number would break
        if not isinstance(shard, str):
            raise ValueError(f"{index_path}: 'weight_map' values must be shard file names, got {json_type_name(shard)}")
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            raise ValueError(f"{index_path}: shard name {shard!r} must be a file name inside the checkpoint directory")
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_shard(os.path.join(directory, shard)))
    for name, shard in weight_map.items():
        if name not in tensors:
            raise ValueError(f"{index_path}: tensor {name!r} is listed in shard {shard!r} but not found there")
    return {name: tensors[name] for name in weight_map}


# File name -> reader of the whole directory, in the order they are looked for.
READERS: dict[str, Callable[[str], dict[str, np.ndarray]]] = {
    SAFETENSORS: lambda d: read_safetensors(os.path.join(d, SAFETENSORS)),
    SAFETENSORS_INDEX: lambda d: _read_index(d, SAFETENSORS_INDEX, read_safetensors),
    TORCH_BIN: lambda d: read_torch_bin(os.path.join(d, TORCH_BIN)),
    TORCH_BIN_INDEX: lambda d: _read_index(d, TORCH_BIN_INDEX, read_torch_bin),
}


def tensor_shapes(directory: str) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in the safetensors checkpoint (one file or shards) in `directory`, from the headers: a
    file claiming tensors larger than its config.json allows is refused before gigabytes are read."""
    name = weights_file(directory)
    if name == SAFETENSORS:
        return safetensors_shapes(os.path.join(directory, SAFETENSORS))
    if name == SAFETENSORS_INDEX:
        return _read_index(directory, SAFETENSORS_INDEX, safetensors_shapes)
    raise ValueError(f"{directory}: {name} is a pickle; its tensors' shapes are known only by reading it")


def weights_file(directory: str) -> str:
    """The name of the weights file `read_weights` reads in `directory` (the first of READERS present)."""
    for name in READERS:
        if os.path.isfile(os.path.join(directory, name)):
            return name
    raise FileNotFoundError(f"{directory}: no weights found (looked for {', '.join(READERS)})")


def read_weights(directory: str, allow_pickle: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in `directory`, by its Hugging Face name (pickles only with allow_pickle)."""
    name = weights_file(directory)
    if name in PICKLED:
        _check_pickle_allowed(directory, name, allow_pickle)
    return READERS[name](directory)


def _check_pickle_allowed(directory: str, name: str, allow_pickle: bool) -> None:
    path = os.path.join(directory, name)
    if not allow_pickle:
        raise ValueError(
            f"{path} is a PyTorch pickle, and unpickling can run code hidden in the file; bertjax reads safetensors "
            "only, unless asked. If you trust the file, pass --allow-pickle (allow_pickle=True in Python), or "
            f"convert it once: bertjax convert --from-hf {directory} --out {directory.rstrip(os.sep)}-bertjax "
            "--allow-pickle (then `bertjax convert --to-hf` writes model.safetensors)")
    log.warning("%s: unpickling a PyTorch checkpoint (allow_pickle=True); do this only for files you trust", path)


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    # An existing file keeps its mode, as open(path, "w") would; a new one gets 0o666 less the umask.
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    # transformers refuses safetensors files whose metadata does not name the framework.
    safetensors.numpy.save_file({name: np.ascontiguousarray(t) for name, t in tensors.items()}, path,
                                metadata={"format": "pt"})
    # safetensors writes a private temporary file (mode 0600) and renames it: without this, nobody but the owner
    # (another user, a serving container) could read the weights, unlike every other file written next to them.
    os.chmod(path, mode)


def _umask() -> int:
    """The process umask, read without changing it where the system says it (Linux): os.umask sets it while
    reading it, a moment in which another thread's files would be created with the wrong mode."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
