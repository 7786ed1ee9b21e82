"""What setup.py declares, read without installing: the venv scripts hash the requirements (a change of them
rebuilds a venv; a change of entry points or description only refreshes the project's metadata), and the verl-omni
tier writes the entry points into its stand-in dist-info from here (setup.py is their one source).

    python scripts/setup_metadata.py requirements        # install_requires + the test extra, one per line
    python scripts/setup_metadata.py entry-points        # entry_points.txt as pip writes it
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_kwargs() -> dict:
    import setuptools

    captured: dict = {}
    real = setuptools.setup
    setuptools.setup = lambda **kw: captured.update(kw)
    try:
        exec(compile((ROOT / "setup.py").read_text(), "setup.py", "exec"), {"__name__": "setup"})
    finally:
        setuptools.setup = real
    return captured


def requirements(kw: dict) -> list[str]:
    return list(kw["install_requires"]) + list(kw["extras_require"]["test"])


def entry_points_txt(kw: dict) -> str:
    return "".join(f"[{group}]\n" + "".join(f"{line}\n" for line in lines) + "\n"
                   for group, lines in kw["entry_points"].items())


if __name__ == "__main__":
    kw = setup_kwargs()
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "requirements":
        print("\n".join(requirements(kw)))
    elif what == "entry-points":
        print(entry_points_txt(kw), end="")
    else:
        sys.exit("usage: setup_metadata.py requirements|entry-points")
