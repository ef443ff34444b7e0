"""Download pretrained weights into the cache: ``python tools/download.py NAME|URL [...]``.

Prints each cached path on stdout (one per line). ``--list`` shows the registry. Downloads resume
an interrupted ``.part`` file (only if the server's file is unchanged: If-Range), retry with
backoff, and are checked against the published or recorded sha256 (``--retrust`` resets a record); ``AMPZOO_WEIGHTS_MIRROR=https://host[/prefix]`` fetches official files from a
mirror. Exit status: 0 done, 2 usage or input error (unknown name, HTTP error, bad checksum, ...).
"""
from __future__ import annotations

import argparse
import sys

import _entry  # puts the repo on sys.path; shared error reporting


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weights", nargs="*", help="registry names (see --list) or http(s) URLs")
    parser.add_argument("--list", action="store_true", help="list the registry and exit")
    parser.add_argument("--force", action="store_true",
                        help="download again even if cached (still verified; the cached file is replaced only "
                             "once the new one verifies)")
    parser.add_argument("--retrust", action="store_true",
                        help="forget the sha256 pinned by the first download (weights/checksums.json), download "
                             "again and pin the new file (a sha256 published in the registry still applies)")
    parser.add_argument("--retries", type=int, default=None, help="retries after a failed attempt (default 3)")
    parser.add_argument("--backoff", type=float, default=None, help="first retry delay in seconds, doubling")
    parser.add_argument("--timeout", type=float, default=None, help="socket timeout in seconds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if not args.list and not args.weights:
        parser.error("give at least one NAME or URL (or --list)")
    if args.retries is not None and args.retries < 0:
        parser.error("--retries must be >= 0")

    from zoo.weights import WeightsError, hub

    try:
        if args.list:
            for name in hub.list_weights():
                spec = hub.get_spec(name)
                print(f"{name:36s} {spec.source:16s} model={spec.model:12s} {spec.url}")
            return 0
        options = {"force": args.force, "retrust": args.retrust, "progress": False if args.no_progress else None}
        for key in ("retries", "backoff", "timeout"):
            if getattr(args, key) is not None:
                options[key] = getattr(args, key)
        for item in args.weights:
            path, _ = hub.resolve(item, **options)
            print(path, flush=True)
    except (WeightsError, OSError) as err:
        return _entry.report_error(err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
