"""Pickle-free-risk loading (zoo.weights.safe_pickle), tar member checks, and safetensors in NumPy.

References: ``paddle.load`` for what a ``paddle.save`` file holds; the ``safetensors`` package (only
here, skipped if absent) reads our files and writes files we read; hand-computed bytes for headers
and bfloat16 bit patterns.
"""
from __future__ import annotations

import collections
import io
import json
import os
import pickle
import random
import struct
import tarfile

import numpy as np
import paddle
import pytest

import zoo
from zoo.engine import checkpoint as ckpt
from zoo.weights import (
    PickleLoadError,
    SafetensorsError,
    UnsafePickleError,
    load_file,
    safe_load,
    save_file,
    save_state,
)
from zoo.weights.loading import read_state


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def evil_bytes(marker, protocol=4):
    return pickle.dumps({"weight": np.zeros(2, np.float32), "x": _Payload(marker)}, protocol=protocol)


@pytest.mark.parametrize("protocol", [2, 4])
def test_malicious_pickle_is_refused_and_does_not_run(tmp_path, protocol):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pdparams"
    path.write_bytes(evil_bytes(marker, protocol))
    with pytest.raises(UnsafePickleError, match=rf"{path}: refused to load global '(posix|os|nt)\.system'"):
        read_state(str(path))
    with pytest.raises(UnsafePickleError):
        zoo.create_model("resnet_tiny", pretrained=str(path))
    bad_ckpt = tmp_path / "last.pdckpt"
    bad_ckpt.write_bytes(evil_bytes(marker, protocol))
    with pytest.raises(ckpt.CheckpointError, match=r"last.pdckpt: UnsafePickleError: .*system"):
        ckpt.read(bad_ckpt)
    assert not marker.exists()
    # The payload is live: plain pickle runs it. So the assertions above mean something.
    pickle.loads(path.read_bytes())
    assert marker.exists()


def test_malicious_member_inside_a_tar_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    tar_path = tmp_path / "det_x_train.tar"
    data = evil_bytes(marker)
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo("det_x_train/best_accuracy.pdparams")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UnsafePickleError, match="det_x_train.tar:det_x_train/best_accuracy.pdparams: refused"):
        read_state(str(tar_path))
    assert not marker.exists()


@pytest.mark.parametrize("name,link", [("../escape.pdparams", None), ("/abs/best_accuracy.pdparams", None),
                                       ("a/../../b.pdparams", None), ("a/link.pdparams", "../../etc/passwd")])
def test_tar_with_escaping_members_is_refused(tmp_path, name, link):
    good = io.BytesIO()
    paddle.save({"w": paddle.zeros([2])}, good)
    tar_path = tmp_path / "w_train.tar"
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo("w_train/best_accuracy.pdparams")
        info.size = len(good.getvalue())
        tar.addfile(info, io.BytesIO(good.getvalue()))
        bad = tarfile.TarInfo(name)
        if link:
            bad.type, bad.linkname = tarfile.SYMTYPE, link
            tar.addfile(bad)
        else:
            bad.size = 3
            tar.addfile(bad, io.BytesIO(b"abc"))
    with pytest.raises(ValueError, match=rf"w_train.tar: refusing tar member '{name}'"):
        read_state(str(tar_path))


def assert_same(ours, ref, where="root"):
    """Structure, types and values equal to what paddle.load returned."""
    assert type(ours) is type(ref), (where, type(ours), type(ref))
    if isinstance(ref, dict):
        assert list(ours) == list(ref), where
        for k in ref:
            assert_same(ours[k], ref[k], f"{where}/{k}")
    elif isinstance(ref, (list, tuple)):
        assert len(ours) == len(ref), where
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(ref, paddle.Tensor):
        assert ours.dtype == ref.dtype and ours.name == ref.name, where
        np.testing.assert_array_equal(ours.numpy(), ref.numpy(), err_msg=where)
    elif isinstance(ref, np.ndarray):
        np.testing.assert_array_equal(ours, ref, err_msg=where)
    elif type(ref).__name__ == "GeneratorState":
        assert ours.__getstate__() == ref.__getstate__(), where
    else:
        assert ours == ref, where


def test_state_dicts_and_training_checkpoints_load_as_paddle_load_does(tmp_path):
    paddle.seed(0)
    model = zoo.create_model("resnet_tiny", num_classes=4)
    opt = paddle.optimizer.Momentum(learning_rate=paddle.optimizer.lr.StepDecay(0.1, 2), parameters=model.parameters())
    model(paddle.randn([2, 3, 16, 16])).mean().backward()
    opt.step()
    files = {}
    for protocol in (2, 3, 4):
        files[f"sd{protocol}"] = tmp_path / f"sd{protocol}.pdparams"
        paddle.save(model.state_dict(), str(files[f"sd{protocol}"]), protocol=protocol)
    # What zoo.engine.checkpoint writes: nested dicts of tensors, optimizer, RNG states, scalars.
    state = {"model": model.state_dict(), "optimizer": ckpt.optimizer_state_portable(opt.state_dict(), model),
             "scaler": {"scale": paddle.to_tensor([1024.0]), "incr_count": 3}, "ema": None, "step": 7,
             "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "paddle": paddle.get_rng_state()},
             "extra": {"pair": (1, "a"), "set": {1, 2}, "complex": 1 + 2j, "np_scalar": np.float32(0.5)},
             "config": "model: resnet_tiny\n"}
    files["ckpt"] = ckpt.atomic_save(state, tmp_path / "last.pdckpt")
    for key, path in files.items():
        assert_same(safe_load(path), paddle.load(str(path)), key)
    loaded = ckpt.load(files["ckpt"])
    assert loaded["step"] == 7 and isinstance(loaded["model"]["fc.weight"], paddle.Tensor)
    np.testing.assert_array_equal(safe_load(files["sd4"], return_numpy=True)["fc.weight"], model.fc.weight.numpy())


def test_old_numpy_module_names_and_split_parameters():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    raw = pickle.dumps({"w": a}, protocol=2)
    new, old = b"numpy._core.multiarray\n_reconstruct", b"numpy.core.multiarray\n_reconstruct"
    raw = raw.replace(new, old) if new in raw else raw
    assert old in raw  # as numpy 1.x wrote it
    np.testing.assert_array_equal(safe_load(raw, return_numpy=True)["w"], a)
    # Protocol 2/3 saves split big arrays into slices (paddle io_utils._unpack_saved_dict).
    split = {"w@@.0": a.ravel()[:5], "w@@.1": a.ravel()[5:], "b": np.ones(2, np.float32),
             "UnpackBigParam" "Infor@@": {"w": {"OriginShape": (3, 4), "slices": ["w@@.0", "w@@.1"]}}}
    got = safe_load(pickle.dumps(split, protocol=2))
    assert sorted(got) == ["b", "w"]
    np.testing.assert_array_equal(got["w"].numpy(), a)


def test_refusals_name_the_global_and_corrupt_files_are_clear(tmp_path):
    for obj, name in ((collections.Counter(a=1), "collections.Counter"), (eval, "builtins.eval"),
                      (np.load, "numpy.load")):
        with pytest.raises(UnsafePickleError, match=rf"<bytes>: refused to load global '{name}'"):
            safe_load(pickle.dumps({"x": obj}))
    cut = tmp_path / "cut.pdparams"
    cut.write_bytes(pickle.dumps({"w": np.zeros(100)})[:50])
    with pytest.raises(PickleLoadError, match=f"{cut}: not a readable paddle.save file"):
        safe_load(cut)


# ---------------------------------------------------------------------------------------------
# safetensors

def sample_tensors():
    rng = np.random.default_rng(0)
    return {"f32": rng.standard_normal((3, 4)).astype(np.float32), "f16": rng.standard_normal(5).astype(np.float16),
            "f64": rng.standard_normal((2, 1, 2)), "i64": np.arange(-3, 3, dtype=np.int64).reshape(2, 3),
            "i32": np.array([7], np.int32), "u8": np.arange(10, dtype=np.uint8), "i8": np.array([-1, 2], np.int8),
            "bool": np.array([True, False, True]), "scalar": np.array(2.5, np.float32),
            "empty": np.zeros((0, 3), np.float32), "big_endian": np.arange(4, dtype=">i4")}


def test_safetensors_layout_by_hand(tmp_path):
    path = save_file({"a": np.array([1.0, 2.0], np.float32), "b": np.array([1], np.int64)}, tmp_path / "x.safetensors",
                     metadata={"format": "pt"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and len(raw) == 8 + n + 16
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "pt"}
    # int64 and float32 laid out back to back, larger items first
    assert header["b"] == {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}
    assert header["a"] == {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}
    assert raw[8 + n:] == b"\x01" + b"\x00" * 7 + b"\x00\x00\x80\x3f" + b"\x00\x00\x00\x40"


def test_safetensors_agrees_with_the_reference_package(tmp_path):
    st = pytest.importorskip("safetensors")
    from safetensors.numpy import load_file as ref_load
    from safetensors.numpy import save_file as ref_save

    tensors = sample_tensors()
    ours = save_file(tensors, tmp_path / "ours.safetensors", metadata={"zoo": "1"})
    back = ref_load(str(ours))
    assert sorted(back) == sorted(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype.newbyteorder("=") and back[k].shape == v.shape, k
        np.testing.assert_array_equal(back[k], v, err_msg=k)
    with st.safe_open(str(ours), framework="numpy") as f:
        assert f.metadata() == {"zoo": "1"}

    ref_tensors = {k: v.astype(v.dtype.newbyteorder("=")) for k, v in tensors.items()}
    ref = tmp_path / "ref.safetensors"
    ref_save(ref_tensors, str(ref), metadata={"m": "v"})
    got = load_file(ref)
    for k, v in ref_tensors.items():
        assert got[k].dtype == v.dtype and got[k].flags.writeable, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_bfloat16_bits(tmp_path):
    t = paddle.to_tensor([1.0, 1.5, -2.0, 3.0e38]).astype("bfloat16")
    path = save_file({"b": t}, tmp_path / "b.safetensors")
    bits = load_file(path, bf16="uint16")["b"]
    # bf16 is the top half of the float32 bits: 1.0 = 0x3F80, 1.5 = 0x3FC0, -2 = 0xC000
    assert bits.tolist()[:3] == [0x3F80, 0x3FC0, 0xC000]
    np.testing.assert_array_equal(load_file(path)["b"], (bits.astype(np.uint32) << 16).view(np.float32))
    try:
        from safetensors.paddle import load_file as ref_paddle_load
    except ImportError:
        return
    ref = ref_paddle_load(str(path))["b"]
    assert ref.dtype == paddle.bfloat16
    np.testing.assert_array_equal(ref.astype("float32").numpy(), load_file(path)["b"])


def write_raw(path, header, data=b""):
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


@pytest.mark.parametrize("header,data,message", [
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4,
     "tensors cover 8 bytes but the file holds 4"),
    ({"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "tensor 'w': unsupported dtype 'Q9'"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "tensor 'w': data_offsets .* needs 8"),
    ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
      "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3, "tensor 'b' starts at byte 1"),
    ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "tensor 'w': shape must be"),
])
def test_malformed_safetensors_errors_name_file_and_tensor(tmp_path, header, data, message):
    path = write_raw(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(SafetensorsError, match=f"{path}: {message}"):
        load_file(path)


def test_safetensors_header_size_and_bad_values(tmp_path):
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(SafetensorsError, match="header size 1000000 exceeds the file"):
        load_file(path)
    with pytest.raises(SafetensorsError, match="tensor 'o': dtype object"):
        save_file({"o": np.array([None])}, tmp_path / "o.safetensors")


def test_read_state_and_create_model_accept_safetensors(tmp_path):
    paddle.seed(4)
    src = zoo.create_model("resnet_tiny", num_classes=3)
    path = save_state(src.state_dict(), tmp_path / "tiny.safetensors")
    state = read_state(str(path))
    assert set(state) == set(src.state_dict()) and isinstance(state["fc.weight"], np.ndarray)
    paddle.seed(5)
    loaded = zoo.create_model("resnet_tiny", pretrained=str(path), num_classes=3, strict=True)
    for k, v in src.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[k].numpy(), v.numpy(), err_msg=k)
    # A float16 export loads into the float32 model (cast, as PaddleOCR's loader does).
    half = save_file({k: v.numpy().astype(np.float16) if v.dtype == paddle.float32 else v.numpy()
                      for k, v in src.state_dict().items()}, tmp_path / "half.safetensors")
    loaded16 = zoo.create_model("resnet_tiny", pretrained=str(half), num_classes=3)
    assert loaded16.fc.weight.dtype == paddle.float32
    want = src.fc.weight.numpy().astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(loaded16.fc.weight.numpy(), want)
