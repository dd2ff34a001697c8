"""Model names a hostile user hands a shared server, and the evidence that would
show any of them ran: callables of the standard library called the way a model
factory is called (`factory(model_config, shape)`), and a module whose import
alone does harm.  Before models were registered, `pty:spawn` ran the script
named by model_config and `shutil:rmtree` deleted the folder it named.

`Sandbox(folder)` writes the would-be programs; `sandbox.cases()` are the
(model, model_config) pairs to try; `sandbox.evidence()` lists what any of them
did (nothing, if all were refused before being imported or called);
`sandbox.pythonpath` must be on PYTHONPATH so that `mpipe_evil` would import.
"""
from __future__ import annotations

import os
from pathlib import Path

EVIL_MODULE = "mpipe_evil"


class Sandbox:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.victim = self.folder / "victim"
        self.victim.mkdir(exist_ok=True)
        (self.victim / "keep").write_text("must survive\n")
        self.script = self.folder / "evil.sh"
        self.script.write_text(f"#!/bin/sh\ntouch {self._marker('pty')}\n")
        self.script.chmod(0o755)
        (self.folder / "evil.py").write_text(f"open({str(self._marker('runpy'))!r}, 'w').close()\n")
        (self.folder / f"{EVIL_MODULE}.py").write_text(
            f"open({str(self._marker('import'))!r}, 'w').close()\n\ndef build(config, shape):\n"
            f"    open({str(self._marker('call'))!r}, 'w').close()\n")

    @property
    def pythonpath(self) -> str:
        return str(self.folder)

    def _marker(self, what: str) -> Path:
        return self.folder / f"marker-{what}"

    def cases(self) -> list[tuple[str, str | None]]:
        touch = lambda what: f"touch {self._marker(what)}"  # noqa: E731
        return [
            ("pty:spawn", str(self.script)),  # ran evil.sh
            ("os:system", touch("os")),
            ("subprocess:getoutput", touch("subprocess")),
            ("subprocess:Popen", touch("popen")),
            ("shutil:rmtree", str(self.victim)),  # deleted the folder
            ("builtins:exec", f"open({str(self._marker('exec'))!r}, 'w').close()"),
            ("runpy:run_path", str(self.folder / "evil.py")),
            (f"{EVIL_MODULE}:build", None),  # importing it is enough
        ]

    def evidence(self) -> list[str]:
        found = sorted(p.name for p in self.folder.glob("marker-*"))
        if not (self.victim / "keep").is_file():
            found.append(f"{self.victim} was deleted")
        return found


def not_registered(model: str, registered: str = "none", root: str | None = None) -> str:
    """The one line a queued run's model that is not registered gets."""
    roots = f"hf:/path under {root}" if root else "no local checkpoints (no checkpoint root is set)"
    hint = ("; a queued run never imports a module:function name, only `mpipe run` on your own machine does"
            if ":" in model else "")
    return (f"run option model: {model!r} is not a registered model (registered: {registered}; presets: tiny, "
            f"tiny-text, tiny-frozen, tiny-varimg, small, vit-heavy; hf:llava, hf:qwen2_5_vl; {roots}){hint}")


def allow_list(folder: Path, models: dict[str, str] | None = None, root: str | None = None,
               entry_points: bool = False) -> Path:
    """A model allow-list file (entry points off by default: the tests see only what they register)."""
    lines = [f"entry_points = {'true' if entry_points else 'false'}"]
    if root:
        lines.append(f"checkpoint_root = {root!r}")
    lines.append("[models]")
    lines += [f"{name} = {factory!r}" for name, factory in (models or {}).items()]
    path = Path(folder) / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def installed_package(folder: Path, modules: dict[str, str], entry_points: dict[str, str],
                      name: str = "mpipe-testmodels") -> Path:
    """A package as pip leaves it installed: `mpipe_testmodels/` with `modules`
    (name -> source) and a `.dist-info` whose `entry_points.txt` declares
    `entry_points` (name -> module:factory) in group mpipe.models.  Put the
    returned folder on PYTHONPATH."""
    site = Path(folder)
    package = site / "mpipe_testmodels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for module, source in modules.items():
        (package / f"{module}.py").write_text(source)
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[mpipe.models]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    (info / "RECORD").write_text("")
    return site


def environ_with(pythonpath: list[str], **env: str) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(pythonpath + [p for p in [out.get("PYTHONPATH")] if p])
    out.update(env)
    return out
