"""The lab node's ``pveproxy``: its HTTPS API on port 8006 of the node's own address, as on a real node.

Run by the node host's PID 1 as a service (:mod:`labsim.net.node_host`, restarted at each boot and when it
dies): ``python3 pveproxy.py ADDRESS PORT SOCKET``. It listens on ``ADDRESS:PORT`` in the node's network
namespace and passes each connection's bytes, both ways and untouched, to the API simulator's HTTPS socket
(``STATE/node-api/pveproxy.sock``, bound into the node with the node tools' folder). TLS ends at the
simulator, so a client sees the simulator's certificate, the one ``pvenode cert info`` shows. Standard
library only: it runs on the node's own Python.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading

BUFFER = 65536


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy until ``src`` ends, then end ``dst``'s sending side (the other direction may go on)."""
    try:
        while True:
            data = src.recv(BUFFER)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _serve_one(client: socket.socket, backend_path: str) -> None:
    with client:
        try:
            backend = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            backend.connect(backend_path)
        except OSError:
            return  # the API is not there (the simulator stopped): the client sees the connection close
        with backend:
            back = threading.Thread(target=_pump, args=(backend, client), daemon=True)
            back.start()
            _pump(client, backend)
            back.join()


def listen(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(64)
    return sock


def serve(sock: socket.socket, backend_path: str) -> None:
    """Accept connections on ``sock`` for ever, each forwarded to the Unix socket ``backend_path``."""
    while True:
        client, _ = sock.accept()
        # the API answers in two writes (headers, body): without this, Nagle and delayed ACK add ~40 ms each
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_one, args=(client, backend_path), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: pveproxy.py ADDRESS PORT SOCKET", file=sys.stderr)
        return 2
    serve(listen(argv[1], int(argv[2])), argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
