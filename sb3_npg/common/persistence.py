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
from collections.abc import Iterable
from typing import Any, TypeVar

import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.type_aliases import GymEnv

from sb3_npg.version import __version__

#: The attribute (saved in ``data``) holding the format record.
FORMAT_KEY = "sb3_npg_format"
#: Bumped whenever a saved model can no longer be loaded by the code of an older version.
FORMAT_VERSION = 1
#: The package's version.
PACKAGE_VERSION = __version__
#: Attributes that files of sb3-npg 0.1.0 hold under other names: the fault counts are now the event counts (the
#: skipped steps are derived from those).
LEGACY_EVENT_COUNTS = "fault_counts"
LEGACY_DERIVED = ("skipped_steps",)
#: The archive members SB3's ``load`` needs.
REQUIRED_MEMBERS = ("data", "policy.pth")
#: SB3's ``load`` also tries the path with this suffix.
MODEL_SUFFIX = ".zip"

PathLike = str | pathlib.Path | io.BufferedIOBase
SelfPersistent = TypeVar("SelfPersistent", bound="RecordedFormat")


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


def upgrade_legacy_attributes(attributes: dict[str, Any]) -> None:
    """
    Bring the attributes of a model loaded from an older file to today's names, in place (the file format is the
    same; only names changed): sb3-npg 0.1.0's ``fault_counts`` become ``event_counts``, and its stored
    ``skipped_steps`` give way to the count derived from them.

    :param attributes: the loaded model's ``__dict__``
    """
    legacy = attributes.pop(LEGACY_EVENT_COUNTS, None)
    for name in LEGACY_DERIVED:
        attributes.pop(name, None)
    if isinstance(legacy, dict):
        current = attributes.get("event_counts", {})
        attributes["event_counts"] = current | {event: count for event, count in legacy.items() if event in current or count}


class RecordedFormat(BaseAlgorithm):
    """
    SB3's ``save`` and ``load``, with the format record: saved with every model, checked before anything is loaded.

    A subclass restores what is not saved (process-local state) in :meth:`_after_load`.
    """

    def save(self, path: PathLike, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None) -> None:
        """
        Save the model as SB3 does, with a record of the saving algorithm and file format that ``load`` checks.

        :param path: the file (``.zip`` is added when missing) or a file object
        :param exclude: names of attributes not to save, in addition to the default ones
        :param include: names of attributes to save even if they would be excluded
        """
        setattr(self, FORMAT_KEY, format_record(type(self).__name__))
        super().save(path, exclude=exclude, include=include)

    @classmethod
    def load(
        cls: type[SelfPersistent],
        path: PathLike,
        env: GymEnv | None = None,
        device: torch.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfPersistent:
        """
        Load a model saved by this algorithm (see SB3's ``BaseAlgorithm.load``).

        Before SB3 deserializes anything, the archive's JSON is read and checked: a file that is not an intact model
        archive, holds another algorithm, or comes from a newer file format gets a ``ValueError`` saying what to do.
        SB3 then unpickles the objects embedded in the archive (the policy class, schedules, spaces): load only files
        you trust, or replace those entries with ``custom_objects``.

        :param path: the saved file (``.zip`` may be omitted) or a file object
        :param env: the environment to continue with (its spaces must match the saved ones)
        :param device: the device to put the model on
        :param custom_objects: entries of the saved data to replace instead of unpickling them
        :param print_system_info: print the system information of the machine that saved the model
        :param force_reset: reset the environment before the next ``learn()``
        :param kwargs: attributes to set on the loaded model
        :return: the loaded model
        """
        check_saved_model(path, cls.__name__)
        model = super().load(
            path,
            env=env,
            device=device,
            custom_objects=custom_objects,
            print_system_info=print_system_info,
            force_reset=force_reset,
            **kwargs,
        )
        upgrade_legacy_attributes(model.__dict__)
        model._after_load()
        return model

    def _after_load(self) -> None:
        """Restore the state that is not saved with the model (nothing by default)."""
