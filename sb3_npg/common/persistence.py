"""What a saved model says about itself, checked before Stable-Baselines3's ``load`` deserializes anything.

SB3's ``save`` writes a zip archive: ``data`` (the algorithm's attributes as JSON, where objects that JSON cannot hold,
such as the policy class and the learning-rate schedule, are embedded as cloudpickle), ``*.pth`` state dicts (read with
``torch.load(weights_only=True)``) and ``system_info.txt``. Our models add one plain JSON entry to ``data``, the
format record: which algorithm saved the file, the file format's version and the package's version. :func:`check_saved_model`
reads only that JSON (``json.loads``, nothing is unpickled or executed) and refuses a file that is not a model
archive, is corrupt, holds another algorithm, or comes from a newer, incompatible format.
"""

from __future__ import annotations

import io
import json
import pathlib
import zipfile
from typing import Any

#: The attribute (saved in ``data``) holding the format record.
FORMAT_KEY = "sb3_npg_format"
#: Bumped whenever a saved model can no longer be loaded by the code of an older version.
FORMAT_VERSION = 1
#: The package's version, from ``version.txt``.
PACKAGE_VERSION = (pathlib.Path(__file__).parent.parent / "version.txt").read_text(encoding="utf-8").strip()
#: The archive members SB3's ``load`` needs.
REQUIRED_MEMBERS = ("data", "policy.pth")
#: SB3's ``load`` also tries the path with this suffix.
MODEL_SUFFIX = ".zip"

PathLike = str | pathlib.Path | io.BufferedIOBase


def format_record(algorithm: str) -> dict[str, Any]:
    """
    The record saved with a model.

    :param algorithm: the class name of the saving algorithm
    :return: a JSON-serializable dict
    """
    return {"algorithm": algorithm, "format_version": FORMAT_VERSION, "package_version": PACKAGE_VERSION}


def _read_bytes(path: PathLike) -> bytes:
    """The archive's bytes, trying ``path`` then ``path.zip`` as SB3 does; a file object is rewound after reading."""
    if isinstance(path, io.BufferedIOBase):
        start = path.tell()
        content = path.read()
        path.seek(start)
        return content
    candidate = pathlib.Path(path)
    if not candidate.exists() and candidate.suffix != MODEL_SUFFIX:
        candidate = candidate.with_name(candidate.name + MODEL_SUFFIX)
    if not candidate.exists():
        raise FileNotFoundError(f"No saved model at {path} (nor at {candidate})")
    return candidate.read_bytes()


def read_saved_data(path: PathLike) -> dict[str, Any]:
    """
    The ``data`` entry of a saved model as plain JSON (embedded pickles stay unread strings).

    :param path: the model's file, as given to ``load``
    :return: the decoded JSON object
    :raises ValueError: when the file is not an intact model archive
    """
    try:
        with zipfile.ZipFile(io.BytesIO(_read_bytes(path))) as archive:
            missing = [member for member in REQUIRED_MEMBERS if member not in archive.namelist()]
            if missing:
                raise ValueError(f"{path} is not a saved model: the archive has no {', '.join(missing)}")
            damaged = archive.testzip()
            if damaged is not None:
                raise ValueError(f"{path} is corrupt: {damaged} fails its checksum")
            data = json.loads(archive.read("data").decode("utf-8"))
    except zipfile.BadZipFile as error:
        raise ValueError(f"{path} is not a saved model (not a zip archive, or a truncated one): {error}") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is corrupt: its data entry is not valid JSON ({error})") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path} is corrupt: its data entry is not a JSON object")
    return data


def check_saved_model(path: PathLike, algorithm: str) -> None:
    """
    Refuse, with a ``ValueError`` that says what to do, a file that ``<algorithm>.load`` cannot load correctly.

    :param path: the model's file, as given to ``load``
    :param algorithm: the class name of the loading algorithm
    """
    record = read_saved_data(path).get(FORMAT_KEY)
    if not isinstance(record, dict):
        raise ValueError(
            f"{path} was not saved by sb3-npg (it has no {FORMAT_KEY!r} record): load it with the class that saved "
            "it, for example sb3_contrib.TRPO.load for sb3-contrib's TRPO"
        )
    saved_by = record.get("algorithm")
    if saved_by != algorithm:
        raise ValueError(f"{path} holds a {saved_by} model, not a {algorithm} one: load it with {saved_by}.load")
    version = record.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{path} was saved by sb3-npg {record.get('package_version')} in file format {version}, which this "
            f"sb3-npg {PACKAGE_VERSION} (format {FORMAT_VERSION}) cannot read: upgrade sb3-npg to load it"
        )
