"""A local `save_pretrained` folder's safetensors, read one tensor at a time.

Which file holds which tensor comes from ``model.safetensors.index.json``
(a sharded checkpoint's ``weight_map``) or, for one ``model.safetensors``,
from its header.  `read_into` opens only the file holding the tensor asked
for (`safetensors.safe_open`, memory-mapped) and copies only that tensor, so
a rank that makes three layers real reads three layers' tensors, never the
whole checkpoint.  `opened` and `tensors_read` record what was read (how a
test sees it).  `check` compares the names and shapes against the model's,
from the headers only, before any rank starts.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import torch

from .protocol import ModelError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class SafetensorsFolder:
    """The tensors of the checkpoint folder `path`; `label` names it in messages;
    `rename` maps a checkpoint key to the model's parameter name (HF renames legacy
    layouts as it loads; None: a tensor that cannot be read alone, left out)."""

    def __init__(self, path: Path, label: str, rename: Callable[[str], str | None] = lambda key: key):
        self.path, self.label = path, label
        self.opened: set[str] = set()  # file names opened to read a tensor
        self.tensors_read: list[str] = []
        if (path / INDEX).is_file():
            self.index_name = INDEX
            try:
                weight_map = json.loads((path / INDEX).read_text())["weight_map"]
                files = {str(k): str(v) for k, v in weight_map.items()}
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise ModelError(f"{label}: {path / INDEX} is not a safetensors index (no weight_map: "
                                 f"{type(error).__name__})") from error
        elif (path / SINGLE).is_file():
            self.index_name = SINGLE
            files = {key: SINGLE for key in self._header(SINGLE)}
        else:
            raise ModelError(f"{label}: {path} has no {SINGLE} or {INDEX} (only safetensors checkpoints "
                             "are read; save with save_pretrained(..., safe_serialization=True))")
        # parameter name -> (file, key in the file)
        self.where: dict[str, tuple[str, str]] = {}
        for key, file in files.items():
            name = rename(key)
            if name is not None:
                self.where[name] = (file, key)

    def _missing(self, name: str, file: str | None = None) -> ModelError:
        return ModelError(f"{self.label}: tensor {name} is not in {self.path / (file or self.index_name)}")

    def _header(self, file: str) -> dict[str, list[int]]:
        """Name -> shape of every tensor in `file` (its header only)."""
        from safetensors import safe_open

        where = self.path / file
        if not where.is_file():
            raise ModelError(f"{self.label}: {self.index_name} names {file}, which is not in {self.path}")
        try:
            with safe_open(str(where), framework="pt") as f:
                return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
        except Exception as error:  # noqa: BLE001 - a damaged file, reported in one line
            raise ModelError(f"{self.label}: cannot read {where}: {type(error).__name__}: {error}") from error

    def check(self, shapes: Iterable[tuple[str, tuple[int, ...]]]) -> None:
        """Refuse a parameter the checkpoint lacks or holds in another shape (headers only)."""
        headers: dict[str, dict[str, list[int]]] = {}
        for name, shape in shapes:
            if name not in self.where:
                raise self._missing(name)
            file, key = self.where[name]
            if file not in headers:
                headers[file] = self._header(file)
            have = headers[file].get(key)
            if have is None:
                raise self._missing(key, file)
            if tuple(have) != tuple(shape):
                raise ModelError(f"{self.label}: tensor {key} in {self.path / file} has shape {have}, "
                                 f"the model's {name} is {list(shape)}")

    def read_into(self, name: str, tensor: torch.Tensor) -> None:
        """Copy parameter `name`'s tensor (converted to `tensor`'s dtype) into `tensor`,
        reading that tensor only."""
        from safetensors import safe_open

        if name not in self.where:
            raise self._missing(name)
        file, key = self.where[name]
        self.opened.add(file)
        with safe_open(str(self.path / file), framework="pt") as f:
            if key not in f.keys():
                raise self._missing(key, file)
            with torch.no_grad():
                tensor.copy_(f.get_tensor(key))
        self.tensors_read.append(name)
