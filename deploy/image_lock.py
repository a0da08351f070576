"""Write requirements-image.lock: each wheel the image installs, pinned with its sha256.

``make lock-image`` downloads the wheels of the ``server`` extra at requirements.lock's versions
for the image's platform (CPython 3.11 on x86-64 glibc Linux), with ``setuptools`` that builds
the project, into a directory; this script reads that directory and prints the lock, which the
Dockerfile installs with ``pip install --require-hashes``. The hashes are ``pip hash``'s: the
sha256 of each file. A wheel whose version is not requirements.lock's is an error.

Usage: ``python deploy/image_lock.py WHEEL_DIRECTORY requirements.lock > requirements-image.lock``
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

HEADER = """\
# The wheels the image installs (the `server` extra and setuptools, which builds the project),
# at requirements.lock's versions, for CPython 3.11 on x86-64 Linux, each with its sha256: the
# Dockerfile installs them with `pip install --require-hashes`. Regenerate with `make lock`
# (or `make lock-image` after editing requirements.lock).
"""

# The tools that build the project: not in requirements.lock (pip freeze leaves them out).
BUILD_TOOLS = {"setuptools"}


def normalized(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(lock: Path) -> dict[str, str]:
    """Each pinned distribution of ``lock`` and its version."""
    versions = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            versions[normalized(name)] = version.strip()
    return versions


def main(wheels: Path, lock: Path) -> int:
    versions = locked_versions(lock)
    lines = [HEADER]
    for wheel in sorted(wheels.glob("*.whl"), key=lambda path: normalized(path.name)):
        name, version = wheel.name.split("-")[:2]
        expected = versions.get(normalized(name))
        if expected is None and normalized(name) not in BUILD_TOOLS:
            print(f"{wheel.name}: {name} is not in {lock}", file=sys.stderr)
            return 1
        if expected is not None and expected != version:
            print(f"{wheel.name}: {lock} pins {name}=={expected}", file=sys.stderr)
            return 1
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        lines.append(f"{normalized(name)}=={version} \\\n    --hash=sha256:{digest}\n")
    sys.stdout.write("".join(lines))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
