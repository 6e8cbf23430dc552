"""The code that runs inside a sandbox: ``seccomp`` (the filter builder and installer), ``runner`` (every
sandbox's pid 1) and ``worker`` (a worker sandbox's main.py).

A sandbox's interpreter is isolated (``-I``) and cannot import this package, so a program is sent as one text:
seccomp.py's, then the program's own, which finds ``libc``, ``seccomp_program`` and ``install_seccomp`` defined
above it (it imports them from :mod:`.seccomp` only as part of this package). Importing the modules does
nothing: a program's actions are in its ``main()``, called only when it runs as ``__main__``.
"""

from pathlib import Path


def program_source(name: str) -> str:
    """The text a sandbox runs as ``name`` (``"runner"`` or ``"worker"``): seccomp.py's, then name.py's."""
    folder = Path(__file__).parent
    return "\n".join((folder / f"{part}.py").read_text(encoding="utf-8") for part in ("seccomp", name))
