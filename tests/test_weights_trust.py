"""Trust on first use made explicit, and resumed downloads that cannot splice two files."""
from __future__ import annotations

import hashlib
import json

import pytest
from conftest import ROOT, run_tool
from test_weights_download import FAST, files_under, home, payload, server  # noqa: F401  (fixtures)

from zoo.weights import ChecksumError, DownloadError, hub

HTML = b"<!DOCTYPE html><html><body>503 Service Temporarily Unavailable</body></html>\n"


def test_error_page_is_not_pinned(server, home):  # noqa: F811
    server.files["/w/x.pdparams"] = HTML  # served with status 200, as some proxies do
    url = server.url("/w/x.pdparams")
    with pytest.raises(DownloadError, match="did not send a weights file: it is a text/HTML document"):
        hub.download(url, **FAST)
    assert files_under(home / "weights") == []  # nothing cached, nothing pinned
    server.files["/w/x.pdparams"] = good = payload(5_000)
    assert hub.download(url, **FAST).read_bytes() == good
    assert hub.read_checksums()[url]["sha256"] == hashlib.sha256(good).hexdigest()


def test_bad_pin_names_checksums_json_and_retrust_resets_it(server, home):  # noqa: F811
    wrong, right = payload(5_000, seed=1), payload(6_000, seed=2)
    server.files["/w/y.pdparams"] = wrong  # a valid file, but not the one meant (fixed later upstream)
    url = server.url("/w/y.pdparams")
    path = hub.download(url, **FAST)
    record = hub.read_checksums()[url]
    assert record["size"] == 5_000 and record["etag"] and record["last_modified"] and record["recorded"]
    server.files["/w/y.pdparams"] = right
    for attempt in ({"force": True}, {}):  # --force, or deleting the cached file, still meet the pin
        if not attempt:
            path.unlink(missing_ok=True)
        with pytest.raises(ChecksumError) as err:
            hub.download(url, **FAST, **attempt)
        msg = str(err.value)
        assert str(home / "weights" / "checksums.json") in msg and "--retrust" in msg and url in msg
        assert "recorded on first download" in msg
    assert hub.download(url, **FAST, retrust=True).read_bytes() == right
    assert hub.read_checksums()[url]["sha256"] == hashlib.sha256(right).hexdigest()


def test_retrust_from_the_command_line(server, tmp_path):  # noqa: F811
    server.files["/pretrained/ResNet18_vd_pretrained.pdparams"] = payload(4_000, seed=3)
    env = {"AMPZOO_HOME": str(tmp_path / "h"), hub.MIRROR_ENV: server.base}
    args = ["tools/download.py", "ResNet18_vd_pretrained", "--retries", "0", "--no-progress"]
    assert run_tool(args, cwd=ROOT, env_extra=env).returncode == 0
    server.files["/pretrained/ResNet18_vd_pretrained.pdparams"] = new = payload(4_000, seed=4)
    bad = run_tool([*args, "--force"], cwd=ROOT, env_extra=env)
    assert bad.returncode == 2 and "checksums.json" in bad.stderr and "--retrust" in bad.stderr
    good = run_tool([*args, "--retrust"], cwd=ROOT, env_extra=env)
    assert good.returncode == 0, good.stderr
    assert open(good.stdout.strip().splitlines()[-1], "rb").read() == new


def test_changed_server_file_is_not_spliced_onto_the_part(server, home):  # noqa: F811
    old, new = payload(100_000, seed=5), payload(100_000, seed=6)
    server.files["/s.pdparams"] = old
    server.cuts["/s.pdparams"] = [30_000]
    url = server.url("/s.pdparams")
    with pytest.raises(DownloadError, match="truncated"):
        hub.download(url, **FAST)
    server.files["/s.pdparams"] = new  # replaced upstream before the resume
    path = hub.download(url, **FAST)
    assert server.requests[-1] == ("/s.pdparams", "bytes=30000-")
    assert server.if_ranges[-1] == '"' + hashlib.sha256(old).hexdigest()[:16] + '"'
    assert path.read_bytes() == new  # the server answered 200 with the whole new file


def test_server_ignoring_if_range_with_a_new_etag_restarts(server, home):  # noqa: F811
    old, new = payload(80_000, seed=7), payload(80_000, seed=8)
    server.files["/i.pdparams"] = old
    server.cuts["/i.pdparams"] = [20_000]
    server.ignore_if_range = True
    url = server.url("/i.pdparams")
    with pytest.raises(DownloadError):
        hub.download(url, **FAST)
    server.files["/i.pdparams"] = new
    assert hub.download(url, **dict(FAST, retries=1)).read_bytes() == new
    assert [r for _, r in server.requests] == [None, "bytes=20000-", None]


def test_part_without_validators_is_restarted(server, home):  # noqa: F811
    data = payload(60_000, seed=9)
    server.validators = False
    server.files["/n.pdparams"] = data
    server.cuts["/n.pdparams"] = [10_000]
    url = server.url("/n.pdparams")
    with pytest.raises(DownloadError):
        hub.download(url, **FAST)
    assert hub.download(url, **FAST).read_bytes() == data
    assert [r for _, r in server.requests] == [None, None]
    assert "etag" not in json.dumps(hub.read_checksums()[url])


def test_format_checks_accept_real_files_of_each_format(tmp_path):
    import numpy as np

    from zoo.weights import pins, save_file

    path = tmp_path / "w.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, path)
    assert pins.not_weights_reason(path, "safetensors") is None
    # A safetensors file starts with its header's length; one of 123 bytes (unpadded, as other
    # writers may make it) starts with "{" and is still not text.
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode().ljust(123)
    path.write_bytes(len(header).to_bytes(8, "little") + header + np.zeros(2, np.float32).tobytes())
    assert path.read_bytes()[:1] == b"{" and pins.not_weights_reason(path, "safetensors") is None
    html = tmp_path / "page.safetensors"
    html.write_bytes(HTML)
    assert "does not parse as a safetensors file" in pins.not_weights_reason(html, "safetensors")
    pd = tmp_path / "w.pdparams"
    pd.write_bytes(payload(3_000))
    assert pins.not_weights_reason(pd, "pdparams") is None
    pd.write_bytes(b"\x80\x04 truncated pickle")
    assert "does not parse as a pdparams file" in pins.not_weights_reason(pd, "pdparams")


def test_force_keeps_the_cached_file_when_the_new_bytes_do_not_match_the_pin(server, home):  # noqa: F811
    """--force used to delete the cached file before downloading: a server whose bytes no longer
    match the pin then left neither. The new bytes go to the .part side file and replace it only
    once they verify."""
    good, changed = payload(5_000, seed=11), payload(5_000, seed=12)
    server.files["/f/w.pdparams"] = good
    url = server.url("/f/w.pdparams")
    path = hub.download(url, **FAST)
    pin = hub.read_checksums()[url]
    server.files["/f/w.pdparams"] = changed
    with pytest.raises(ChecksumError) as err:
        hub.download(url, **FAST, force=True)
    msg = str(err.value)
    assert f"the download was deleted; the cached {path} is kept as it was" in msg and "--retrust" in msg
    assert hashlib.sha256(changed).hexdigest() in msg and pin["sha256"] in msg
    assert path.read_bytes() == good and hub.read_checksums()[url] == pin
    assert files_under(path.parent) == [path.name]  # no .part or .part.meta left beside it
    requests = len(server.requests)
    assert hub.download(url, **FAST) == path and len(server.requests) == requests  # still the verified copy
    server.files["/f/w.pdparams"] = good  # the server is fixed: --force downloads and replaces it
    assert hub.download(url, **FAST, force=True).read_bytes() == good and len(server.requests) == requests + 1


def test_force_or_retrust_that_fails_leaves_the_cached_file_and_its_pin(server, home):  # noqa: F811
    good = payload(5_000, seed=13)
    server.files["/f/v.pdparams"] = good
    url = server.url("/f/v.pdparams")
    path = hub.download(url, **FAST)
    pin = hub.read_checksums()[url]
    server.status["/f/v.pdparams"] = 404
    with pytest.raises(DownloadError, match=f"HTTP 404 .*; the cached {path} is kept as it was"):
        hub.download(url, **FAST, force=True)
    del server.status["/f/v.pdparams"]
    server.files["/f/v.pdparams"] = HTML  # an error page: --retrust must not trust it nor lose the old pin
    with pytest.raises(DownloadError, match=f"did not send a weights file.*; the cached {path} is kept as it was"):
        hub.download(url, **FAST, retrust=True)
    assert path.read_bytes() == good and hub.read_checksums()[url] == pin
    published = hashlib.sha256(good).hexdigest()
    server.files["/f/v.pdparams"] = payload(5_000, seed=14)  # a published sha256 still applies under --retrust
    with pytest.raises(ChecksumError, match=f"published in the registry.*the cached {path} is kept as it was"):
        hub.download(url, published, **FAST, retrust=True)
    assert path.read_bytes() == good and hub.read_checksums()[url] == pin


def test_force_from_the_command_line_keeps_the_cached_file(server, tmp_path):  # noqa: F811
    server.files["/pretrained/ResNet18_vd_pretrained.pdparams"] = good = payload(4_000, seed=15)
    env = {"AMPZOO_HOME": str(tmp_path / "h"), hub.MIRROR_ENV: server.base}
    args = ["tools/download.py", "ResNet18_vd_pretrained", "--retries", "0", "--no-progress"]
    first = run_tool(args, cwd=ROOT, env_extra=env)
    assert first.returncode == 0, first.stderr
    cached = first.stdout.strip().splitlines()[-1]
    server.files["/pretrained/ResNet18_vd_pretrained.pdparams"] = payload(4_000, seed=16)
    bad = run_tool([*args, "--force"], cwd=ROOT, env_extra=env)
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1 and "Traceback" not in bad.stderr
    assert errors[0].startswith("error: checksum mismatch") and f"the cached {cached} is kept as it was" in errors[0]
    assert open(cached, "rb").read() == good
    again = run_tool(args, cwd=ROOT, env_extra=env)  # and it is still served from the cache
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == cached
