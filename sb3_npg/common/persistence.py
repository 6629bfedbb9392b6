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
import inspect
import warnings
from collections.abc import Iterable
from typing import Any, ClassVar, TypeVar


import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.type_aliases import GymEnv

# ScaledSchedule stays importable here: models converted from sb3-contrib files pickle it under this module's name.
from sb3_npg.common.kl_convention import ScaledSchedule, kl_components, scaled  # noqa: F401
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

#: Where a loaded file comes from.
SB3_NPG = "sb3-npg"
SB3_CONTRIB_TRPO = "sb3-contrib TRPO"
#: Attributes that every file of sb3-contrib's TRPO holds (and files of other algorithms do not, together).
SB3_CONTRIB_TRPO_ATTRIBUTES = frozenset(
    {"cg_max_steps", "cg_damping", "line_search_shrinking_factor", "line_search_max_iter", "n_critic_updates"}
)
#: The saved optimizer state, which a converted file leaves out; and the flag that asks for that while it loads.
OPTIMIZER_STATE = "policy.optimizer"
FRESH_OPTIMIZER = "_load_with_fresh_optimizer"
#: The options ``load`` was told to replace through ``custom_objects``, which its validation leaves alone (the RL
#: Zoo's ``enjoy`` replaces the learning rate by 0.0 so that no schedule is unpickled).
VALIDATION_EXEMPT = "_load_validation_exempt"

PathLike = str | pathlib.Path | io.BufferedIOBase
SelfPersistent = TypeVar("SelfPersistent", bound="RecordedFormat")


#: Letters whose spoken name starts with a vowel sound ("an NPG model", "an RL agent").
VOWEL_SOUND_LETTERS = frozenset("AEFHILMNORSX")


def with_article(name: str) -> str:
    """``name`` after "a" or "an", as it is read aloud: an acronym by its first letter's name, a word by its vowel."""
    initial = name[:1]
    vowel = initial in VOWEL_SOUND_LETTERS if name.isupper() else initial.lower() in "aeiou"
    return f"{'an' if vowel else 'a'} {name}"


def format_record(cls: type) -> dict[str, Any]:
    """
    The record saved with a model.

    :param cls: the saving algorithm
    :return: a JSON-serializable dict: the class's name and :func:`lineage`, the file format and package versions
    """
    return {
        "algorithm": cls.__name__,
        "lineage": lineage(cls),
        "format_version": FORMAT_VERSION,
        "package_version": PACKAGE_VERSION,
    }


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


def lineage(cls: type) -> list[str]:
    """
    The names of ``cls`` and of its bases that are concrete algorithms, nearest first (``MyTRPO``, ``TRPO``): what a
    file records about the class that saved it, and what decides which classes may load it.
    """
    names = []
    for klass in cls.__mro__:
        if klass is RecordedFormat:
            break
        if not inspect.isabstract(klass):
            names.append(klass.__name__)
    return names or [cls.__name__]


def is_sb3_contrib_trpo(data: dict[str, Any]) -> bool:
    """Whether a saved model's data, without our format record, has the attributes of sb3-contrib's TRPO."""
    return FORMAT_KEY not in data and SB3_CONTRIB_TRPO_ATTRIBUTES <= data.keys()


def check_saved_model(path: PathLike, cls: type) -> str:
    """
    Refuse, with a ``ValueError`` that says what to do, a file that ``cls.load`` cannot load correctly.

    A file saved by ``cls``, by one of its bases or by one of its subclasses loads; so does one saved by sb3-contrib's
    TRPO when ``cls`` converts those (:attr:`RecordedFormat.reads_sb3_contrib_trpo`).

    :param path: the model's file, as given to ``load``
    :param cls: the loading algorithm
    :return: where the file comes from: :data:`SB3_NPG` or :data:`SB3_CONTRIB_TRPO`
    """
    data = read_saved_data(path)
    if getattr(cls, "reads_sb3_contrib_trpo", False) and is_sb3_contrib_trpo(data):
        return SB3_CONTRIB_TRPO
    record = data.get(FORMAT_KEY)
    if not isinstance(record, dict):
        raise ValueError(
            f"{path} was not saved by sb3-npg (it has no {FORMAT_KEY!r} record): load it with the class that saved "
            "it, for example sb3_contrib.PPO.load for sb3-contrib's PPO"
        )
    saved = record.get("lineage") or [record.get("algorithm")]
    loading = lineage(cls)
    if saved[0] not in loading and loading[0] not in saved:
        raise ValueError(
            f"{path} holds {with_article(str(saved[0]))} model, not {with_article(loading[0])} one: load it with "
            f"{saved[0]}.load"
        )
    version = record.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{path} was saved by sb3-npg {record.get('package_version')} in file format {version}, which this "
            f"sb3-npg {PACKAGE_VERSION} (format {FORMAT_VERSION}) cannot read: upgrade sb3-npg to load it"
        )
    return SB3_NPG


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

    #: Whether ``load`` converts files saved by sb3-contrib's TRPO (:func:`convert_sb3_contrib_trpo`).
    reads_sb3_contrib_trpo: ClassVar[bool] = False

    def save(self, path: PathLike, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None) -> None:
        """
        Save the model as SB3 does, with a record of the saving algorithm and file format that ``load`` checks.

        :param path: the file (``.zip`` is added when missing) or a file object
        :param exclude: names of attributes not to save, in addition to the default ones
        :param include: names of attributes to save even if they would be excluded
        """
        setattr(self, FORMAT_KEY, format_record(type(self)))
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
        origin = check_saved_model(path, cls)
        kwargs = {**kwargs, VALIDATION_EXEMPT: tuple(set(custom_objects or ()) - set(kwargs))}
        if origin == SB3_CONTRIB_TRPO:
            kwargs[FRESH_OPTIMIZER] = True
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
        if origin == SB3_CONTRIB_TRPO:
            convert_sb3_contrib_trpo(model, path)
        model._after_load()
        return model

    def set_parameters(
        self,
        load_path_or_dict: str | dict[str, Any],
        exact_match: bool = True,
        device: torch.device | str = "auto",
    ) -> None:
        """SB3's ``set_parameters``; while a converted file loads, its optimizer state is left out (ours is fresh)."""
        if self.__dict__.pop(FRESH_OPTIMIZER, False) and isinstance(load_path_or_dict, dict):
            load_path_or_dict = {name: state for name, state in load_path_or_dict.items() if name != OPTIMIZER_STATE}
            exact_match = False
        super().set_parameters(load_path_or_dict, exact_match=exact_match, device=device)

    def _after_load(self) -> None:
        """Restore the state that is not saved with the model (nothing by default)."""


def _shown(value: Any) -> str:
    """A number in short form (``0.01``), a schedule by its ``repr``."""
    return repr(value) if callable(value) else f"{value:g}"


def convert_sb3_contrib_trpo(model: BaseAlgorithm, path: PathLike) -> None:
    """
    Make a model loaded from an sb3-contrib TRPO file continue as sb3-contrib's would, and say what changed.

    The policy weights are sb3-contrib's. The critic's optimizer starts fresh: sb3-contrib's covers every parameter,
    ours the critic's only. ``target_kl`` (a number, or a schedule given to ``load``) and ``cg_damping`` are
    multiplied by :func:`kl_components` (the dimensions of a Box or MultiBinary action), which poses the same trust
    region and the same conjugate-gradient problem with our summed KL. sb3-contrib saves ``max_grad_norm=0``, so the
    critic stays unclipped, as it was.
    """
    scale = kl_components(model.action_space)
    old_target, old_damping = model.target_kl, model.cg_damping  # type: ignore[attr-defined]
    new_target, new_damping = scaled(old_target, scale), scale * old_damping
    model.target_kl, model.cg_damping = new_target, new_damping  # type: ignore[attr-defined]
    if scale > 1:
        region = (
            f"sb3-contrib averages the KL over the {scale} action dimensions where we sum it, so target_kl "
            f"{_shown(old_target)} -> {_shown(new_target)} and cg_damping {old_damping:g} -> {new_damping:g} keep its "
            "trust region"
        )
    else:
        region = f"its KL equals ours on this action space, so target_kl {_shown(old_target)} and cg_damping are kept"
    warnings.warn(
        f"{path} was saved by sb3-contrib's TRPO and converted: its policy weights are loaded and the critic's "
        f"optimizer starts fresh (sb3-contrib's covers every parameter, ours the critic's only); {region}; "
        "max_grad_norm stays as saved "
        f"({model.max_grad_norm!r}: no clip).",  # type: ignore[attr-defined]
        UserWarning,
        stacklevel=3,
    )
