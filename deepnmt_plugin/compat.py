"""Shims that make fairseq 0.12 (``fairseq-fixed``) work on torch >= 2.6 / Python 3.11, and make its
failures safe and clear: checkpoints written atomically and resumed from an intact one, resume that
repeats the uninterrupted run's batches, and one line (no traceback) for unreadable checkpoints, data
files and flags, and for a checkpoint resumed with other model flags than it was trained with.

Every shim names the upstream problem it works around. Importing the plugin installs them
(``fairseq-train --user-dir deepnmt_plugin`` imports it before any checkpoint is read).
"""

import argparse
import contextlib
import errno
import functools
import glob
import inspect
import logging
import os
import pickle
import re
import secrets
import shutil
import struct
import types
from typing import Optional

import numpy
import torch
from fairseq import checkpoint_utils, utils
from fairseq.data import bucket_pad_length_dataset, data_utils, indexed_dataset
from fairseq.data.audio import raw_audio_dataset
from fairseq.distributed import utils as distributed_utils
from fairseq.file_io import PathManager
from fairseq.optim import fp16_optimizer
from fairseq.tasks import FairseqTask
from fairseq.tasks.translation import TranslationTask
from fairseq.trainer import Trainer
from numpy._core.multiarray import _reconstruct as numpy_reconstruct

from deepnmt_plugin.flat_masters import (flat_bf16_masters, flat_grads_synced, flat_params_synced,
                                         master_and_state_restored, master_saved)

logger = logging.getLogger(__name__)

# torch >= 2.6 defaults ``torch.load(weights_only=True)``, whose unpickler refuses every global
# that is not allowlisted; fairseq 0.12 calls ``torch.load`` without ``weights_only`` and its
# checkpoints hold ``argparse.Namespace`` (legacy ``args`` and ``cfg.model``), and the state
# fairseq broadcasts from rank 0 on a distributed resume holds ``_TensorPlaceholder``; a run validated with
# ``--eval-bleu`` keeps sacreBLEU's n-gram counts in its metrics as numpy arrays (numpy's array constructor, an
# ndarray and the dtype of numpy's default integer or float). We allowlist exactly these instead of turning
# weights-only loading off for the process.
# numpy 1.x pickles its array constructor as numpy.core.multiarray._reconstruct and numpy 2 as
# numpy._core.multiarray._reconstruct (numpy >= 1.26 imports both): both names are allowed, so a checkpoint written under
# one numpy loads under the other.
FAIRSEQ_CHECKPOINT_GLOBALS = (
    argparse.Namespace,
    distributed_utils._TensorPlaceholder,
    (numpy_reconstruct, "numpy.core.multiarray._reconstruct"),
    (numpy_reconstruct, "numpy._core.multiarray._reconstruct"),
    numpy.ndarray,
    numpy.dtype,
    type(numpy.dtype(int)),
    type(numpy.dtype(float)),
)


def _global_name(allowed) -> str:
    """The name a checkpoint calls an allowed global by: given with it, or its own."""
    return allowed[1] if isinstance(allowed, tuple) else f"{allowed.__module__}.{allowed.__qualname__}"


class CheckpointError(SystemExit):
    """A checkpoint cannot be used: one line naming it and the cause, exit status 1 (no traceback)."""

    def __init__(self, path, reason: str, message: Optional[str] = None):
        self.path, self.reason = str(path), reason
        super().__init__(message or f"deepnmt: error: cannot read checkpoint {path}: {reason}")


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint references a Python global outside the fairseq allowlist."""

    def __init__(self, path, found_global: str):
        allowed = ", ".join(_global_name(allowed) for allowed in FAIRSEQ_CHECKPOINT_GLOBALS)
        super().__init__(path, f"it references {found_global}", (
            f"deepnmt: error: refusing to load checkpoint {path}: it references {found_global}, which is not one "
            f"of the types fairseq checkpoints contain ({allowed}); "
            "load it with torch.load(..., weights_only=False) only if you trust its source"
        ))


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file cannot be read or holds no fairseq checkpoint.

    torch reports a truncated file as a multi-line ``RuntimeError`` about miniz, an empty one as a bare
    ``EOFError`` and a damaged legacy pickle as a ``KeyError``; a file that reads but holds no fairseq
    checkpoint fails inside fairseq's upgrade code with a ``KeyError`` or ``TypeError``. All name neither
    file nor cause.
    """


# What torch.load (its unpickler fails in many ways on random bytes) and fairseq's upgrade of the loaded
# dict raise for an unreadable file.
UNREADABLE_CHECKPOINT_ERRORS = (RuntimeError, EOFError, KeyError, IndexError, ValueError, pickle.UnpicklingError)


def _checkpoint_error(path, error: BaseException) -> CheckpointError:
    """The one-line error for a checkpoint that failed to load: unsafe global, or unreadable file."""
    found = re.search(r"GLOBAL (\S+)", str(error))
    if isinstance(error, pickle.UnpicklingError) and found:
        return UnsafeCheckpointError(path, found.group(1))
    # torch's weights-only unpickler puts the actual cause after a paragraph about weights_only
    detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(error))
    cause = detail.group(1) if detail else str(error).strip().split("\n")[0].split(". ")[0]
    return CorruptCheckpointError(path, "the file is truncated, corrupt or not a fairseq checkpoint "
                                        f"({type(error).__name__}{': ' + cause if cause else ''})")


def _check_contents(path, state) -> None:
    """A loaded checkpoint is a dict with model parameters (fairseq fails on anything else later, in a traceback)."""
    if not isinstance(state, dict):
        raise CorruptCheckpointError(path, f"it holds a {type(state).__name__}, not a fairseq checkpoint dict")
    if not state.get("model"):
        raise CorruptCheckpointError(path, "its 'model' holds no parameters")


def _refuse_unreadable(load_checkpoint_to_cpu):
    """Turn torch's multi-paragraph load errors into one line naming the file and the cause."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load(path, *args, **kwargs):
        try:
            state = load_checkpoint_to_cpu(path, *args, **kwargs)
        except UNREADABLE_CHECKPOINT_ERRORS as error:
            raise _checkpoint_error(path, error) from None
        except (TypeError, AttributeError) as error:  # fairseq indexes whatever torch.load returned as a dict
            raise CorruptCheckpointError(path, f"it holds no fairseq checkpoint dict ({type(error).__name__}: "
                                               f"{error})") from None
        _check_contents(path, state)
        return state

    return load


def read_checkpoint(path) -> dict:
    """A checkpoint's dict exactly as saved (no fairseq upgrade), weights-only, with the same errors.

    For tools that rewrite checkpoints (averaging, export): what they save keeps the saved structure.
    """
    try:
        with open(path, "rb") as handle:
            state = torch.load(handle, map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(path, "no such file") from None
    except IsADirectoryError:
        raise CheckpointError(path, "it is a directory, not a checkpoint file") from None
    except UNREADABLE_CHECKPOINT_ERRORS as error:
        raise _checkpoint_error(path, error) from None
    _check_contents(path, state)
    return state


class WriteError(SystemExit):
    """An output that could not be written (a full disk, a read-only folder): one line naming it and why."""

    def __init__(self, path, reason: str):
        super().__init__(f"deepnmt: error: cannot write {path}: {reason}")


# What a failed write says: the disk or the user's quota is full, the folder is read-only or not the user's.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)


def write_failure(path, error: BaseException) -> Optional[WriteError]:
    """The one line for ``error`` raised while writing ``path`` (a file, or a folder of files), or None where it is
    not a failed write. torch.save's zip writer reports a failed open or a short write as a RuntimeError
    (``inline_container.cc``), not as the OSError beneath it."""
    if isinstance(error, OSError) and error.errno in WRITE_ERRNOS:
        beside = os.path.dirname(os.path.abspath(path))  # path itself, its temporary files, its folder's
        ours = error.filename is None or os.path.abspath(error.filename).startswith(beside)
        return WriteError(path, error.strerror) if ours else None
    if isinstance(error, RuntimeError) and "inline_container" in str(error):
        said = re.search(r"strerror: (.+)", str(error))
        reason = said.group(1).strip() if said else os.strerror(errno.ENOSPC) if _disk_full(path) else None
        return WriteError(path, reason) if reason else None
    return None


def _disk_full(path) -> bool:
    try:
        return os.statvfs(os.path.dirname(os.path.abspath(path))).f_bavail == 0
    except OSError:  # its folder is missing: another problem, said by the error itself
        return False


@contextlib.contextmanager
def writing(path):
    """A command's writing of ``path`` (a file, or a folder of files) outside ``atomic_write``: a failed write in
    one line naming it."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        failure = write_failure(path, error)
        if failure is None:
            raise
        raise failure from None


@contextlib.contextmanager
def atomic_write(path):
    """Yield a temporary path beside ``path``, this call's alone (pid and random suffix: two processes writing one
    file must not write one temporary file, or each renames the other's half-written bytes); once the body has
    written it, fsync it and rename it over ``path``. A crash (kill -9, power loss) leaves the old file or the new
    one, never a torn one; an exception leaves no temporary file, and a failed write (full disk, read-only folder)
    is one line (``WriteError``)."""
    partial = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        yield partial
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, path)
    except BaseException as error:
        with contextlib.suppress(OSError):  # never written (a read-only folder), or gone
            os.remove(partial)
        failure = write_failure(path, error)
        if failure is None:
            raise
        raise failure from None
    fsync(os.path.dirname(os.path.abspath(path)))  # the rename itself survives a power loss


def fsync(path) -> None:
    """Write a file, or a directory's entries, through to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError:  # some network and FUSE file systems cannot sync a directory (renames stay atomic); a file must
        if not os.path.isdir(path):
            raise
    finally:
        os.close(descriptor)


def save_atomically(obj, path) -> None:
    with atomic_write(path) as partial:
        torch.save(obj, partial)


def _atomic_persistent_save(torch_persistent_save):
    """fairseq writes a checkpoint to ``NAME.tmp`` and renames it, but never fsyncs: after a power loss
    the renamed file can be empty; and ``NAME.tmp`` is every writer's, so two trainers saving into one
    save-dir tear each other's checkpoint. Remote (ioPath) and asynchronous writes keep fairseq's way."""

    @functools.wraps(torch_persistent_save)
    def save(obj, filename, async_write: bool = False):
        if async_write or PathManager.path_requires_pathmanager(filename):
            return torch_persistent_save(obj, filename, async_write)
        save_atomically(obj, filename)

    return save


def _save_dir_in_one_line(verify_checkpoint_directory):
    """fairseq-train creates --save-dir and writes a file into it before training: in a read-only folder (or one not
    the user's, or on a full disk) it fails in a traceback."""

    @functools.wraps(verify_checkpoint_directory)
    def verify(save_dir: str) -> None:
        with writing(save_dir):
            verify_checkpoint_directory(save_dir)

    return verify


def _atomic_copy(copy):
    """fairseq copies the checkpoint it wrote to its other names (``checkpoint_last.pt``, ``checkpoint_best.pt``)
    with a plain ``shutil.copyfile``, which truncates the target first: a kill during the copy leaves a torn
    ``checkpoint_last.pt``. Copy to a temporary file and rename it instead (remote ioPath files: fairseq's way)."""

    @functools.wraps(copy)
    def atomic(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(src_path) or PathManager.path_requires_pathmanager(dst_path):
            return copy(src_path, dst_path, overwrite)
        if not overwrite and os.path.exists(dst_path):
            return False
        with atomic_write(dst_path) as partial:
            shutil.copyfile(src_path, partial)
        return True

    return atomic


# The names fairseq's save_checkpoint gives (crash.pt, the state after a failed update, is not one).
SAVED_CHECKPOINT = r"checkpoint(\d+|_\d+_\d+|_best|\.best_.+){suffix}\.pt"


def newest_intact_checkpoint(save_dir: str, suffix: str = "") -> Optional[str]:
    """The most recently written checkpoint in ``save_dir`` (other than checkpoint_last) that loads, or None."""
    pattern = re.compile(SAVED_CHECKPOINT.format(suffix=re.escape(suffix)))
    candidates = [os.path.join(save_dir, name) for name in os.listdir(save_dir) if pattern.fullmatch(name)]
    for path in sorted(candidates, key=os.path.getmtime, reverse=True):
        try:
            checkpoint_utils.load_checkpoint_to_cpu(path)
        except CorruptCheckpointError:
            continue
        return path
    return None


def _resume_from_an_intact_checkpoint(load_checkpoint):
    """fairseq resumes from ``checkpoint_last.pt`` only; when that file is unreadable (torn by a crash
    during a non-atomic save), resume from the newest checkpoint in --save-dir that loads, and say so."""

    @functools.wraps(load_checkpoint)
    def load(cfg, trainer, **passthrough_args):
        try:
            return load_checkpoint(cfg, trainer, **passthrough_args)
        except CorruptCheckpointError as error:
            last = os.path.join(cfg.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
            is_last = os.path.abspath(error.path) == os.path.abspath(last)
            fallback = is_last and cfg.restore_file == "checkpoint_last.pt" and newest_intact_checkpoint(
                cfg.save_dir, trainer.checkpoint_suffix)
            if not fallback:
                raise
            reason = error.reason
        logger.warning(f"deepnmt: {last} is unreadable ({reason}); resuming from {fallback}, "
                       f"the newest intact checkpoint in {cfg.save_dir}")
        cfg.restore_file = fallback
        try:
            return load_checkpoint(cfg, trainer, **passthrough_args)
        finally:
            cfg.restore_file = "checkpoint_last.pt"

    return load


# The model flags that decide which parameters a model has, and their shapes.
def _refuse_another_model(load_checkpoint):
    """Resumed with other model flags than its checkpoint was trained with, fairseq either fails to load the parameters
    in a traceback that names no flag (another --encoder-layers: "please ensure that the architectures match") or,
    where the shapes fit, trains on as another model and saves it under the new flags (another --arch, another
    recipe constant such as ResiDual's --enc-alpha). Name the flags and both values in one line before anything is
    loaded or saved. A start from a checkpoint's weights with the optimizer reset (--finetune-from-model,
    --reset-optimizer) is a new training and may change the model."""

    @functools.wraps(load_checkpoint)
    def load(self, filename, reset_optimizer=False, *args, **kwargs):
        # imported here: the recipes' flags are known once the models are registered, after fairseq is patched
        from deepnmt_plugin.model_flags import ARCH_RECORDED, as_dict, differing_model_flags

        def refuse(reason: str):
            raise SystemExit(f"deepnmt: error: cannot resume from {filename}: {reason}; give the flags it was trained "
                             "with, or another --save-dir") from None

        def other_flags(saved, given) -> str:
            differing = differing_model_flags(saved, given)
            names = [name for name in differing if name not in ARCH_RECORDED] or differing  # the flags a user gives

            def flags(model_cfg) -> str:
                return " ".join(f"--{name.replace('_', '-')} {model_cfg.get(name)}" for name in names)

            return names and f"it was trained with {flags(as_dict(saved))}, not {flags(as_dict(given))}"

        if not reset_optimizer and os.path.exists(filename):
            saved = checkpoint_utils.load_checkpoint_to_cpu(filename).get("cfg") or {}
            reason = saved and other_flags(saved["model"], self.cfg.model)
            if reason:
                refuse(reason)
        try:
            return load_checkpoint(self, filename, reset_optimizer, *args, **kwargs)
        except Exception as error:
            if not str(error).startswith("Cannot load model parameters from checkpoint"):
                raise
            refuse(other_flags(checkpoint_utils.load_checkpoint_to_cpu(filename)["cfg"]["model"], self.cfg.model)
                   or "its parameters do not fit the model these flags build")

    return load


class DataDirectoryError(SystemExit):
    """``fairseq-train DATA`` without a usable DATA: one line naming it, exit status 1 (no traceback)."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


def _check_data_directories(setup_task):
    """fairseq's translation tasks answer a missing or empty data directory with a FileNotFoundError
    traceback from deep inside ``setup_task``; check first and say which directory is wrong."""

    @functools.wraps(setup_task)
    def setup(cls, cfg, **kwargs):
        for path in utils.split_paths(cfg.data):
            if not os.path.isdir(path):
                raise DataDirectoryError(f"data directory {path} does not exist")
            if not glob.glob(os.path.join(path, "dict.*.txt")):
                raise DataDirectoryError(
                    f"data directory {path} holds no fairseq-preprocess output (no dict.*.txt)"
                )
        return setup_task(cls, cfg, **kwargs)

    return setup


# fairseq's MMapIndexedDataset index: magic, version, dtype code, number of entries; then int32 sizes, int64 pointers.
MMAP_INDEX_HEADER = struct.Struct("<9sQBQ")
MMAP_INDEX_MAGIC = indexed_dataset.MMapIndexedDataset.Index._HDR_MAGIC


def check_binarized(prefix: str) -> None:
    """Refuse a truncated fairseq-preprocess (mmap) ``PREFIX.idx`` / ``PREFIX.bin`` pair, from their sizes alone."""
    index, data = indexed_dataset.index_file_path(prefix), indexed_dataset.data_file_path(prefix)
    if not (os.path.isfile(index) and os.path.isfile(data)):
        return
    rebuild = "rebuild the data directory with fairseq-preprocess (data-prep)"
    with open(index, "rb") as handle:
        header = handle.read(MMAP_INDEX_HEADER.size)
        if len(header) < MMAP_INDEX_HEADER.size:
            if MMAP_INDEX_MAGIC.startswith(header[:len(MMAP_INDEX_MAGIC)]):
                raise DataDirectoryError(
                    f"{index} is truncated ({len(header)} bytes, shorter than its header); {rebuild}")
            return
        magic, _, dtype_code, count = MMAP_INDEX_HEADER.unpack(header)
        if magic != MMAP_INDEX_MAGIC:
            return  # another --dataset-impl: fairseq checks it
        index_size, expected_index_size = os.path.getsize(index), MMAP_INDEX_HEADER.size + 12 * count
        if index_size < expected_index_size:
            raise DataDirectoryError(f"{index} is truncated ({index_size} bytes, its {count} entries need "
                                     f"{expected_index_size}); {rebuild}")
        if count == 0:
            return
        handle.seek(MMAP_INDEX_HEADER.size + 4 * (count - 1))
        (last_size,) = struct.unpack("<i", handle.read(4))
        handle.seek(MMAP_INDEX_HEADER.size + 4 * count + 8 * (count - 1))
        (last_pointer,) = struct.unpack("<q", handle.read(8))
    data_size = os.path.getsize(data)
    expected_data_size = last_pointer + last_size * indexed_dataset._code_to_dtype[dtype_code]().itemsize
    if data_size < expected_data_size:
        raise DataDirectoryError(
            f"{data} is truncated ({data_size} bytes, {index} needs {expected_data_size}); {rebuild}")


def _check_binarized_files(make_dataset):
    """A truncated .idx fails in a numpy buffer error, a truncated .bin only once a batch reaches its missing
    tail (or silently reads garbage), both in a traceback naming neither file; check the pair first."""

    @functools.wraps(make_dataset)
    def make(path, *args, **kwargs):
        check_binarized(path)
        return make_dataset(path, *args, **kwargs)

    return make


def _batches_of_the_first_epoch(get_batch_iterator):
    """fairseq groups sentences into batches when a task first builds a dataset's iterator, with numpy seed
    ``--seed + epoch``, and reuses those batches in every later epoch (shuffling their order per epoch). A run
    resumed in epoch E > 1 builds them at E, so its batches hold other sentences than the uninterrupted run's
    from then on, and a mid-epoch resume skips batches it never trained on. Build them as in epoch 1."""
    signature = inspect.signature(get_batch_iterator)

    @functools.wraps(get_batch_iterator)
    def get(self, *args, **kwargs):
        call = signature.bind(self, *args, **kwargs)
        call.apply_defaults()
        options = call.arguments
        dataset, epoch = options["dataset"], options["epoch"]
        reused_across_epochs = (
            not options["disable_iterator_cache"] and not options["update_epoch_batch_itr"]
            and self.can_reuse_epoch_itr(dataset) and dataset not in self.dataset_to_epoch_iter
        )
        if epoch == 1 or not reused_across_epochs:
            return get_batch_iterator(*call.args, **call.kwargs)
        options["epoch"] = 1
        iterator = get_batch_iterator(*call.args, **call.kwargs)
        iterator.epoch = epoch  # epoch 1's batches, in the order (seed + epoch) of the epoch resumed
        dataset.set_epoch(epoch)
        return iterator

    return get


# What fairseq's DynamicLossScaler counts besides the loss scale: when it last overflowed and rescaled.
LOSS_SCALER_COUNTERS = ("_iter", "_last_overflow_iter", "_last_rescale_iter", "_overflows_since_rescale")


def _saving_loss_scaler_counters(state_dict):
    """fairseq saves an fp16 optimizer's loss scale but not its loss scaler's counters, so a resumed run
    raises the scale (every --fp16-scale-window updates after an overflow) at other updates than the
    uninterrupted run, and its gradients and overflows differ from then on. Save them too."""

    @functools.wraps(state_dict)
    def saved(self):
        state = state_dict(self)
        if self.scaler is not None:
            state["loss_scaler"] = {name: getattr(self.scaler, name) for name in LOSS_SCALER_COUNTERS}
        return state

    return saved


def _restoring_loss_scaler_counters(load_state_dict):
    @functools.wraps(load_state_dict)
    def loaded(self, state, optimizer_overrides=None):
        load_state_dict(self, state, optimizer_overrides)
        if self.scaler is not None:
            for name, value in state.get("loss_scaler", {}).items():  # none in checkpoints of older runs
                setattr(self.scaler, name, value)

    return loaded


# fairseq sets --fp16 along with --memory-efficient-fp16; name the flag given.
FP16_FLAGS = ("memory_efficient_fp16", "fp16")


def _refuse_fp16_on_cpu(init):
    """fairseq's FP16Optimizer builds its fp32 master on the current CUDA device and its loss scaler empties CUDA's
    cache: with --cpu --fp16 it fails in a traceback (``Torch not compiled with CUDA enabled``). bf16 needs neither
    (``flat_masters.py``) and trains on the CPU."""

    @functools.wraps(init)
    def checked(self, cfg, *args, **kwargs):
        common = cfg.common if hasattr(cfg, "common") else cfg  # an argparse.Namespace is flat
        flag = next((name for name in FP16_FLAGS if getattr(common, name, False)), None)
        if common.cpu and flag:
            flag = "--" + flag.replace("_", "-")
            raise SystemExit(f"deepnmt: error: {flag} trains on a GPU; with --cpu, train in fp32 or --bf16 (drop {flag})")
        init(self, cfg, *args, **kwargs)

    return checked


def bf16_off_tpu(cfg) -> None:
    """fairseq 0.12 reads ``--bf16`` as "bfloat16 on a TPU" (``options.py`` sets ``--tpu`` with it), so without a TPU
    it crashes in ``torch_xla``. Where ``torch_xla`` is not installed, train in bf16 where the run would train
    otherwise, on CUDA or (``--cpu``, or no GPU) on the CPU: fairseq's Trainer then casts the model to bfloat16 and its
    FP16Optimizer keeps fp32 master weights without loss scaling, as in later fairseq versions."""
    common = cfg.common
    if common.bf16 and common.tpu and not _has_torch_xla():
        common.tpu = False


def _has_torch_xla() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


def check_admin_profile_file(task_cfg) -> None:
    profile = getattr(task_cfg, "admin_profile_file", None)
    if profile and not os.path.isfile(profile):
        raise SystemExit(f"deepnmt: error: --admin-profile-file {profile}: no such file")


def _admin_profile_errors_in_one_line(main, cfg, **kwargs):
    """Admin's profile reader raises a ValueError naming ``PATH:LINE`` once the model is built; say it in one line."""
    from deepnmt_plugin.models.admin import ProfileFileError

    try:
        return main(cfg, **kwargs)
    except ProfileFileError as error:
        raise SystemExit(f"deepnmt: error: --admin-profile-file {error}") from None


def _checked_start(call_main):
    """fairseq-train's way into training: bf16 kept off the TPU and the Admin profile file checked before anything
    runs, and its parse errors said in one line (in every process)."""

    @functools.wraps(call_main)
    def call(cfg, main, **kwargs):
        bf16_off_tpu(cfg)
        check_admin_profile_file(cfg.task)
        return call_main(cfg, functools.partial(_admin_profile_errors_in_one_line, main), **kwargs)

    return call


def _cpu_ranks_under_torchrun(infer):
    """fairseq takes a torchrun rank's device as ``RANK % torch.cuda.device_count()``: a division by zero on nodes
    without CUDA (``fairseq-train --cpu`` under torchrun). There a rank keeps torchrun's local rank as its id."""

    @functools.wraps(infer)
    def infer_on_cpu(cfg):
        if torch.cuda.device_count() > 0:
            return infer(cfg)
        cfg.distributed_init_method = "env://"
        cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
        cfg.distributed_rank = int(os.environ["RANK"])
        cfg.device_id = int(os.environ.get("LOCAL_RANK", 0))
        cfg.distributed_no_spawn = True  # torchrun started the processes

    return infer_on_cpu


def _pruning_one_stack_keeps_the_other(prune_state_dict):
    """fairseq 0.12 drops every layer of a stack whose ``*_layers_to_keep`` is unset when the other stack's is set (no
    pruning pass names it), and the load then fails on missing keys: keep that stack's layers as they are."""

    @functools.wraps(prune_state_dict)
    def prune(state_dict, model_cfg):
        unpruned = [side for side in ("encoder", "decoder")
                    if model_cfg is not None and not getattr(model_cfg, f"{side}_layers_to_keep", None)]
        pruned = prune_state_dict(state_dict, model_cfg)  # it clears both flags in model_cfg
        if pruned is state_dict or len(unpruned) != 1:
            return pruned
        layer_of_the_other_stack = re.compile(rf"^{unpruned[0]}.*\.layers\.\d+\.")
        kept = {name: value for name, value in state_dict.items() if layer_of_the_other_stack.search(name)}
        return {**pruned, **kept}

    return prune


# fairseq 0.12 still calls numpy names that numpy has removed: np.float (gone since numpy 1.24; DynamicCRF, the
# non-autoregressive models' CRF) and np.compat.long (gone in numpy 2; LanguagePairDataset with --num-batch-buckets,
# TokenBlockDataset's "eos" mode). Each is the Python type numpy's alias stood for. fairseq looks them up when the call
# runs, so restoring them when the plugin is imported (fairseq-train --user-dir imports it before any dataset or model
# is built) is in time for every entry point. (Its np.int sits in compute_mask_indices' no_overlap branch, which fails
# before reaching it on any numpy: it calls randint on a numpy Generator.)
REMOVED_NUMPY_NAMES = {"float": float}
REMOVED_NUMPY_COMPAT_NAMES = {"long": int}


def _restore_numpy_names_fairseq_calls() -> None:
    for name, value in REMOVED_NUMPY_NAMES.items():
        if name not in vars(numpy):
            setattr(numpy, name, value)
    if "compat" not in vars(numpy):
        numpy.compat = types.ModuleType("numpy.compat", "numpy 1.x's numpy.compat, as far as fairseq 0.12 uses it")
    for name, value in REMOVED_NUMPY_COMPAT_NAMES.items():
        if not hasattr(numpy.compat, name):
            setattr(numpy.compat, name, value)


def _percentile_by_method(get_buckets):
    """fairseq's ``get_buckets`` (``--num-batch-buckets``) passes ``np.percentile(..., interpolation=)``, which numpy 2.4
    removed; the same buckets under the argument's name since numpy 1.22, ``method=``."""

    @functools.wraps(get_buckets)
    def buckets(sizes, num_buckets):
        return numpy.unique(numpy.percentile(sizes, numpy.linspace(0, 100, num_buckets + 1), method="lower")[1:])

    return buckets


def _every_sentence_batched(batch_by_size):
    """fairseq-fixed 0.12.3.1's ``batch_by_size`` drops the last batch when its size is not a multiple of
    ``--required-batch-size-multiple`` (8 by default): ``fairseq-generate --batch-size 16`` printed 48 of 50 sentences,
    validation scored fewer sentences than the set holds, and training left the last few out of every epoch. Keep
    it: the batches are consecutive slices of ``indices``, so the dropped one is what follows the others (batches of
    ``fixed_shapes`` are fairseq's as they are)."""
    signature = inspect.signature(batch_by_size)

    @functools.wraps(batch_by_size)
    def batches(indices, *args, **kwargs):
        kept = batch_by_size(indices, *args, **kwargs)
        if signature.bind(indices, *args, **kwargs).arguments.get("fixed_shapes") is not None:
            return kept
        batched = sum(len(batch) for batch in kept)
        if batched < len(indices):
            kept.append(numpy.asarray(indices[batched:], dtype=numpy.int64))
        return kept

    return batches


def _wrap(owner, name: str, shim) -> None:
    """Replace ``owner.name`` by ``shim(owner.name)``, once per shim (importing the plugin twice wraps nothing
    twice); a static or class method stays one, its function wrapped (so a subclass still gets itself as ``cls``)."""
    current = inspect.getattr_static(owner, name)
    kind = type(current) if isinstance(current, (staticmethod, classmethod)) else None
    function = current.__func__ if kind else current
    applied = getattr(function, "deepnmt_shims", ())
    if shim.__name__ in applied:
        return
    wrapped = shim(function)
    wrapped.deepnmt_shims = (*applied, shim.__name__)
    setattr(owner, name, kind(wrapped) if kind else wrapped)


def install():
    _restore_numpy_names_fairseq_calls()
    for module in (data_utils, bucket_pad_length_dataset, raw_audio_dataset):  # the latter two import it by name
        _wrap(module, "get_buckets", _percentile_by_method)
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4; older torch loads unrestricted
        torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_GLOBALS))
    _wrap(checkpoint_utils, "load_checkpoint_to_cpu", _refuse_unreadable)
    _wrap(checkpoint_utils, "torch_persistent_save", _atomic_persistent_save)
    _wrap(checkpoint_utils, "load_checkpoint", _resume_from_an_intact_checkpoint)
    _wrap(checkpoint_utils, "prune_state_dict", _pruning_one_stack_keeps_the_other)
    _wrap(checkpoint_utils, "verify_checkpoint_directory", _save_dir_in_one_line)
    _wrap(PathManager, "copy", _atomic_copy)
    _wrap(indexed_dataset, "make_dataset", _check_binarized_files)
    _wrap(data_utils, "batch_by_size", _every_sentence_batched)
    _wrap(FairseqTask, "get_batch_iterator", _batches_of_the_first_epoch)
    for mixin in (fp16_optimizer._FP16OptimizerMixin, fp16_optimizer._MemoryEfficientFP16OptimizerMixin):
        _wrap(mixin, "state_dict", _saving_loss_scaler_counters)
        _wrap(mixin, "load_state_dict", _restoring_loss_scaler_counters)
    _wrap(fp16_optimizer.FP16Optimizer, "build_optimizer", flat_bf16_masters)
    _wrap(fp16_optimizer._FP16OptimizerMixin, "state_dict", master_saved)
    _wrap(fp16_optimizer._FP16OptimizerMixin, "load_state_dict", master_and_state_restored)
    _wrap(fp16_optimizer._FP16OptimizerMixin, "_sync_fp16_grads_to_fp32", flat_grads_synced)
    _wrap(fp16_optimizer._FP16OptimizerMixin, "_sync_fp32_params_to_fp16", flat_params_synced)
    _wrap(Trainer, "__init__", _refuse_fp16_on_cpu)
    _wrap(Trainer, "load_checkpoint", _refuse_another_model)
    _wrap(distributed_utils, "call_main", _checked_start)
    _wrap(distributed_utils, "_infer_torch_distributed_launch_init", _cpu_ranks_under_torchrun)
    _wrap(TranslationTask, "setup_task", _check_data_directories)
