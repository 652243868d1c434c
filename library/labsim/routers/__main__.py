"""Serve one router simulator on 127.0.0.1: `python -m labsim.routers KIND [options]`."""

from __future__ import annotations

import argparse
import sys
import threading

from . import KINDS, SIMULATORS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labsim.routers", description=__doc__)
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free one)")
    ap.add_argument("--user", default="admin", help="login (the API key for opnsense)")
    ap.add_argument("--password", default="admin", help="password (the API secret for opnsense)")
    ap.add_argument("--tls-dir", help="serve HTTPS with a self-signed certificate kept in this folder")
    ap.add_argument("--log", help="append one JSON line per request to this file")
    args = ap.parse_args(argv)
    cls = SIMULATORS[args.kind]
    creds = {"key": args.user, "secret": args.password} if args.kind == "opnsense" else {
        "user": args.user, "password": args.password}  # fmt: skip
    sim = cls(**creds, port=args.port, tls_dir=args.tls_dir, log_file=args.log).start()
    print(sim.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
