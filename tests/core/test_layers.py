"""mpipe_core stays pure, and imports only point down the layers (DESIGN.md)."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# layer -> the top-level packages it may import from this project
ALLOWED = {
    "mpipe_core": {"mpipe_core"},
    "storage": {"storage", "mpipe_core"},
    "executor": {"executor", "storage", "mpipe_core"},
    "app": {"app", "executor", "storage", "mpipe_core"},
}
PROJECT = {"mpipe_core", "storage", "executor", "app", "mpipe_cli", "benchmarks"}


def test_core_imports_without_torch_streamlit_or_a_database():
    code = ("import sys, mpipe_core.api, mpipe_core.compare, mpipe_core.export.torch_csv, mpipe_core.export.trace;"
            "mpipe_core.api.evaluate('transpose(1f1b(p=4, m=4), mode=dynamic)', 'vit-heavy-small');"
            "bad = [m for m in ('torch', 'streamlit', 'sqlalchemy', 'plotly', 'numpy') if m in sys.modules];"
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_imports_point_down_the_layers():
    wrong = []
    for layer, allowed in ALLOWED.items():
        for path in (ROOT / layer).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top in PROJECT and top not in allowed:
                        wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert wrong == []
