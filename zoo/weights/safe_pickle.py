"""Load ``paddle.save`` files without running code from them (the idea of torch's ``weights_only``).

A pickle can call any importable function while it is read, so ``paddle.load`` on a downloaded file
runs whatever the file says. This unpickler resolves only the globals that ``paddle.save`` (Paddle
3.3.1, protocols 2-4) writes for state dicts and for our training checkpoints, and refuses every
other one by name before anything is called:

- numpy: ``ndarray``, ``dtype`` and the functions that rebuild arrays and scalars
  (``_reconstruct``, ``scalar`` under both ``numpy.core.multiarray`` and ``numpy._core.multiarray``);
- ``_codecs.encode`` (protocol 2 writes bytes through it);
- ``collections.OrderedDict`` and plain builtins (tuple, list, dict, set, frozenset, complex, ...);
- ``paddle.base.libpaddle.GeneratorState`` (``paddle.get_rng_state()`` in checkpoints).

After unpickling, arrays become tensors as ``paddle.load`` does it (``paddle/framework/io.py``
``load`` / ``_parse_load_result``): a tensor is saved as a ``(name, ndarray)`` tuple and only those
are converted when any is present; otherwise every ndarray is; Paddle 2.0's
``StructuredToParameterName@@`` table and protocol-2 ``UnpackBigParamInfor@@`` slices are undone.
"""
from __future__ import annotations

import collections
import io
import os
import pickle

import numpy as np

__all__ = ["PickleLoadError", "UnsafePickleError", "load"]


class PickleLoadError(ValueError):
    """The file is not a readable pickle (truncated, corrupt, not a pickle); the message names it."""


class UnsafePickleError(PickleLoadError):
    """The pickle references a global outside the allow-list; the message names file and global."""


def _numpy_globals() -> dict[tuple[str, str], object]:
    # Found through numpy's own reducers, so this works on numpy 1.x (numpy.core) and 2.x (numpy._core).
    reconstruct = np.empty(0).__reduce__()[0]
    scalar = np.float32(0).__reduce__()[0]
    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
        allowed[(module, "scalar")] = scalar
    return allowed


def _allowed_globals() -> dict[tuple[str, str], object]:
    import _codecs
    import builtins

    allowed = _numpy_globals()
    allowed[("_codecs", "encode")] = _codecs.encode
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    for name in ("tuple", "list", "dict", "set", "frozenset", "complex", "bytearray"):
        allowed[("builtins", name)] = getattr(builtins, name)
    try:
        import paddle

        allowed[("paddle.base.libpaddle", "GeneratorState")] = type(paddle.get_rng_state()[0])
    except (ImportError, IndexError):
        pass
    return allowed


_ALLOWED: dict[tuple[str, str], object] | None = None
# Protocol 2 pickles written by Python 2 (or with fix_imports) use the old module names.
_OLD_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, source: str):
        super().__init__(file, encoding="latin1")  # as paddle.load (Python 2 era numpy arrays)
        self.source = source

    def find_class(self, module: str, name: str):
        global _ALLOWED
        if _ALLOWED is None:
            _ALLOWED = _allowed_globals()
        found = _ALLOWED.get((_OLD_MODULES.get(module, module), name))
        if found is None:
            raise UnsafePickleError(
                f"{self.source}: refused to load global '{module}.{name}': only numpy arrays, dtypes and "
                f"plain containers are allowed in weight files (this file would run code when read by "
                f"paddle.load or pickle; do not load it unless you trust where it came from)")
        return found

    def persistent_load(self, pid):
        raise UnsafePickleError(f"{self.source}: refused persistent id {pid!r} (not a paddle.save file)")


def _is_named_array(obj) -> bool:
    return type(obj) is tuple and len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], np.ndarray)


def _contains(obj, test) -> bool:
    if test(obj):
        return True
    if type(obj) in (dict, collections.OrderedDict):
        return any(_contains(v, test) for v in obj.values())
    if type(obj) in (list, tuple):
        return any(_contains(v, test) for v in obj)
    return False


def _convert(obj, test, fn):
    """Apply ``fn`` to every part of ``obj`` passing ``test``, through dicts, lists, tuples and sets."""
    if test(obj):
        return fn(obj)
    if type(obj) in (dict, collections.OrderedDict):
        out = type(obj)()
        for k, v in obj.items():
            out[k] = _convert(v, test, fn)
        return out
    if type(obj) in (list, tuple, set):
        return type(obj)(_convert(v, test, fn) for v in obj)
    return obj


def _unpack_big_params(obj):
    """Join arrays that protocol 2/3 saves split into ``key@@.i`` slices (paddle ``_pack_loaded_dict``)."""
    info_key = "UnpackBigParam" + "Infor@@"  # Paddle's spelling
    if not isinstance(obj, dict) or info_key not in obj:
        return obj
    for key, info in obj.pop(info_key).items():
        obj[key] = np.concatenate([obj.pop(part) for part in info["slices"]]).reshape(info["OriginShape"])
    return obj


def _to_tensors(obj, return_numpy: bool):
    import paddle

    def named(t):
        if return_numpy:
            return t[1]
        tensor = paddle.to_tensor(t[1])
        tensor.name = t[0]
        return tensor

    def plain(a):
        return a if return_numpy else paddle.to_tensor(a)

    table_key = "StructuredToParameterName@@"
    if isinstance(obj, dict) and table_key in obj:  # Paddle 2.0 paddle.save of a state dict
        table = obj.pop(table_key)
        for key in table:
            if isinstance(obj.get(key), np.ndarray):
                obj[key] = plain(obj[key])
                if not return_numpy:
                    obj[key].name = table[key]
        return obj
    if _contains(obj, _is_named_array):
        return _convert(obj, _is_named_array, named)
    return _convert(obj, lambda a: isinstance(a, np.ndarray), plain)


def load(source, name: str | None = None, return_numpy: bool = False):
    """Read a ``paddle.save`` pickle (path, bytes or binary file object) without running code.

    Returns what ``paddle.load`` would (tensors in place of saved tensors), or NumPy arrays with
    ``return_numpy=True``. Any global outside the allow-list raises :class:`UnsafePickleError`
    naming the file and the global; a corrupt or truncated pickle raises :class:`PickleLoadError`.
    """
    if isinstance(source, (str, os.PathLike)):
        label = name or str(source)
        with open(source, "rb") as f:
            obj = _unpickle(f, label)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        obj = _unpickle(io.BytesIO(source), name or "<bytes>")
    else:
        obj = _unpickle(source, name or str(getattr(source, "name", "<file>")))
    return _to_tensors(_unpack_big_params(obj), return_numpy)


def _unpickle(f, label: str):
    try:
        return _RestrictedUnpickler(f, label).load()
    except PickleLoadError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, MemoryError) as e:
        raise PickleLoadError(f"{label}: not a readable paddle.save file ({type(e).__name__}: {e})") from e

