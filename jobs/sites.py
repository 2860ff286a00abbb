"""Site files: a cluster's scheduler options for ``lartpc sweep --site NAME``.

A site is a TOML file under ``jobs/sites/`` (or any path given to ``--site``) whose keys
are the sweep's own options; each is a default that an option on the command line
overrides. ``prelude`` is a path relative to the site file. ``account_required`` makes
``--account`` mandatory, with ``account_hint`` saying what to charge. ``gpus_per_node``
and ``nodes`` (the partition's GPU node count) are the machine's size: the sweep refuses
a ``--gpus-per-node`` above the one and a GPU count that needs more than the other.
``srun_mpi`` is srun's ``--mpi`` plugin for Horovod over MPI (``cray_shasta`` on HPE
Cray machines; ``pmix`` when the site does not say).
"""

from __future__ import annotations

import sys
from pathlib import Path

from lartpc.errors import LartpcError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: key -> type of every key a site file may hold
SITE_KEYS: dict[str, type] = {
    "description": str, "scheduler": str, "launcher": str, "gpus_per_node": int, "nodes": int,
    "cores_per_node": int, "time": str, "queue": str, "constraint": str, "qos": str,
    "reservation": str, "account_required": bool, "account_hint": str,
    "sbatch_args": list, "bsub_args": list, "prelude": str, "srun_mpi": str,
}


def sites_dir() -> Path:
    """The folder of the shipped site files."""
    return Path(__file__).resolve().parent / "sites"


def site_names() -> list[str]:
    """Names ``--site`` takes without a path."""
    return sorted(p.stem for p in sites_dir().glob("*.toml"))


def load_site(name: str) -> dict:
    """The site's settings, checked: a shipped name or a path to a TOML file.

    Raises
    ------
    LartpcError
        Unknown name, unreadable or invalid TOML, an unknown key or a value of the
        wrong type (naming the file and key), or a prelude that does not exist.
    """
    path = Path(name) if name.endswith(".toml") or "/" in name else sites_dir() / f"{name}.toml"
    if not path.is_file():
        raise LartpcError(f"--site {name}: no such site file {path}; shipped sites: "
                          f"{', '.join(site_names())}")
    try:
        site = tomllib.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
        raise LartpcError(f"site file {path}: {e}") from e
    for key, value in site.items():
        want = SITE_KEYS.get(key)
        if want is None:
            raise LartpcError(f"site file {path}: unknown key {key!r}; known: "
                              f"{', '.join(sorted(SITE_KEYS))}")
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise LartpcError(f"site file {path}: {key} = {value!r} is not a {want.__name__}")
        if want is int and value < 1:
            raise LartpcError(f"site file {path}: {key} = {value!r} must be at least 1")
        if want is list and not all(isinstance(v, str) for v in value):
            raise LartpcError(f"site file {path}: {key} must be a list of strings")
    if "prelude" in site:
        prelude = (path.parent / site["prelude"]).resolve()
        if not prelude.is_file():
            raise LartpcError(f"site file {path}: prelude {site['prelude']!r} not found "
                              f"({prelude})")
        site["prelude"] = str(prelude)
    site["_path"] = str(path)
    return site
