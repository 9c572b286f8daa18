"""One build step pyproject.toml cannot say: the learner edition of every chapter, in both languages, goes into the
package, so that an installed course needs no checkout of the repository.

The chapters are notebooks/NN_*.ipynb and notebooks/zh/NN_*.ipynb (the sdist carries them: MANIFEST.in). The wheel
has them as transformer_lab/notebooks/ and transformer_lab/notebooks/zh/, where `transformer-lab lab` finds them
(transformer_lab/workspace.py). An editable install copies nothing: it reads the checkout's notebooks/.
Everything else (name, version, dependencies, package data) is in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
EDITIONS = {"": HERE / "notebooks", "zh": HERE / "notebooks" / "zh"}  # folder in the package: the learner edition


class BuildPyWithChapters(build_py):
    """build_py, plus the learner edition's chapters copied into transformer_lab/notebooks/ of the build."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for sub, source in EDITIONS.items():
            chapters = sorted(source.glob("[0-9][0-9]_*.ipynb"))
            if not chapters:
                raise SystemExit(
                    f"setup.py: no chapter (NN_*.ipynb) in {source}: build from a full checkout of the repository "
                    "or from its sdist, which carry the learner edition"
                )
            target = Path(self.build_lib) / "transformer_lab" / "notebooks" / sub
            self.mkpath(str(target))
            for chapter in chapters:
                self.copy_file(str(chapter), str(target / chapter.name))


setup(cmdclass={"build_py": BuildPyWithChapters})
