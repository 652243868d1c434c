"""The k3s stand-in's certificates, as k3s keeps them in ``/var/lib/rancher/k3s/server/tls``, and its listener.

k3s makes its own CAs at a server's first start (``server-ca`` signs the API server's serving certificate,
``client-ca`` the clients' certificates, among them ``client-admin``: CN ``system:admin``, O ``system:masters``),
ECDSA P-256 (pkg/daemons/control/deps/deps.go @v1.33.5+k3s1, genServerCerts/genClientCerts); a server that
joins takes the cluster's CAs from the one it joins (:func:`ca_files` / :func:`adopt_cas`). The serving
certificate names the API's addresses: ``kubernetes`` and its service names, ``localhost``, the host name,
127.0.0.1, the node's address and every ``tls-san`` (k3s adds SANs as clients reach it: dynamiclistener;
here the certificate is made again when the wanted names change). The kubeconfig k3s writes carries the
server CA as ``certificate-authority-data`` and the admin's certificate and key (:func:`kubeconfig`).

The stand-in makes them with the host's ``openssl`` (Debian's ca-certificates depends on it). Its listener
(:func:`DualServer`) speaks TLS to a client that opens with a TLS handshake, asking for a client certificate of
``client-ca`` (optional: a token may stand for it), and plain HTTP to the stand-in's own parts (agents, peers,
``k3s kubectl``), which know the lab's shortcut; a real kubectl always speaks TLS.
"""

import base64
import contextlib
import http.server
import json
import os
import socket
import ssl
import subprocess
import threading

TLS_DIR = "/var/lib/rancher/k3s/server/tls"
CA_NAMES = ("server-ca", "client-ca")
SERVICE_IP = "10.43.0.1"  # the first address of k3s' default service CIDR (10.43.0.0/16): Service kubernetes
#: how a connection that opens with a TLS record starts (a handshake record: 0x16)
TLS_HANDSHAKE = 0x16


def _path(name, ext, folder=TLS_DIR):
    return os.path.join(folder, f"{name}.{ext}")


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _key(path):
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
    os.chmod(path, 0o600)


def _make_ca(name, folder):
    key, crt = _path(name, "key", folder), _path(name, "crt", folder)
    _key(key)
    subject = f"/CN=k3s-{name}@{int(os.path.getmtime(key))}"
    _openssl("req", "-x509", "-new", "-key", key, "-subj", subject, "-days", "3650", "-out", crt,
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,digitalSignature")  # fmt: skip


def _sign(name, ca, subject, extensions, folder):
    """A leaf certificate `name` signed by CA `ca` (files in `folder`), valid a year like k3s'."""
    key, crt = _path(name, "key", folder), _path(name, "crt", folder)
    _key(key)
    csr = _path(name, "csr", folder)
    ext = _path(name, "ext", folder)
    _openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr)
    with open(ext, "w") as f:
        f.write(extensions)
    _openssl("x509", "-req", "-in", csr, "-CA", _path(ca, "crt", folder), "-CAkey", _path(ca, "key", folder),
             "-CAcreateserial", "-days", "365", "-extfile", ext, "-out", crt)  # fmt: skip
    for leftover in (csr, ext, _path(ca, "srl", folder)):
        with contextlib.suppress(OSError):
            os.remove(leftover)


def serving_names(address, hostname, sans):
    """The API server certificate's names: (DNS names, IP addresses), sorted, without repeats."""
    dns = {
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
    dns |= {"localhost", hostname}
    ips = {"127.0.0.1", SERVICE_IP, address}
    for san in sans:
        san = str(san).strip()
        if san:
            (ips if san.replace(".", "").isdigit() or ":" in san else dns).add(san)
    return sorted(n for n in dns if n), sorted(i for i in ips if i)


def ensure(address, hostname, sans, folder=TLS_DIR):
    """The CAs (made once, kept), the admin's client certificate (made once per client CA) and the serving
    certificate (made again when its names change)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for ca in CA_NAMES:
        if not os.path.exists(_path(ca, "crt", folder)):
            _make_ca(ca, folder)
    admin_for = _path("client-admin", "ca", folder)
    client_ca = _read(_path("client-ca", "crt", folder))
    if _read(admin_for) != client_ca or not os.path.exists(_path("client-admin", "crt", folder)):
        _sign("client-admin", "client-ca", "/O=system:masters/CN=system:admin",
              "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n", folder)  # fmt: skip
        _write(admin_for, client_ca)
    dns, ips = serving_names(address, hostname, sans)
    wanted = json.dumps({"dns": dns, "ip": ips, "ca": _read(_path("server-ca", "crt", folder))})
    names_file = _path("serving-kube-apiserver", "names", folder)
    if _read(names_file) != wanted:
        alt = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
        _sign("serving-kube-apiserver", "server-ca", "/CN=kube-apiserver",
              f"keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
              f"subjectAltName={alt}\n", folder)  # fmt: skip
        _write(names_file, wanted)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(path, text, mode=0o600):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.chmod(path + ".tmp", mode)
    os.replace(path + ".tmp", path)


def ca_files(folder=TLS_DIR):
    """The cluster's CAs, for a server that joins (the join answer; the joining server gave the token)."""
    return {f"{ca}.{ext}": _read(_path(ca, ext, folder)) for ca in CA_NAMES for ext in ("crt", "key")}


def adopt_cas(files, folder=TLS_DIR):
    """A joining server keeps the cluster's CAs (the admin and serving certificates follow at `ensure`)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for name, text in (files or {}).items():
        if name in ca_files(folder) and text and _read(os.path.join(folder, name)) != text:
            _write(os.path.join(folder, name), text)


def _b64(path):
    return base64.b64encode(_read(path).encode()).decode()


def kubeconfig(server_url, folder=TLS_DIR):
    """k3s' admin kubeconfig text (pkg/cli/server/server.go writes it through pkg/daemons/control/deps):
    cluster, user and context ``default``, the server CA and the admin's client certificate and key."""
    return (
        "apiVersion: v1\nclusters:\n- cluster:\n"
        f"    certificate-authority-data: {_b64(_path('server-ca', 'crt', folder))}\n"
        f"    server: {server_url}\n  name: default\n"
        "contexts:\n- context:\n    cluster: default\n    user: default\n  name: default\n"
        "current-context: default\nkind: Config\npreferences: {}\nusers:\n- name: default\n  user:\n"
        f"    client-certificate-data: {_b64(_path('client-admin', 'crt', folder))}\n"
        f"    client-key-data: {_b64(_path('client-admin', 'key', folder))}\n"
    )


class DualServer(http.server.ThreadingHTTPServer):
    """The API's listener: TLS to a client whose first byte opens a TLS handshake (a real kubectl), plain HTTP
    to the stand-in's own parts. The TLS context is read again when the serving certificate changes."""

    folder = TLS_DIR

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self._ctx, self._ctx_key, self._ctx_lock = None, None, threading.Lock()

    def context(self):
        crt, key = (
            _path("serving-kube-apiserver", "crt", self.folder),
            _path("serving-kube-apiserver", "key", self.folder),
        )
        stamp = (os.path.getmtime(crt), os.path.getmtime(_path("client-ca", "crt", self.folder)))
        with self._ctx_lock:
            if self._ctx_key != stamp:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ctx.load_cert_chain(crt, key)
                ctx.load_verify_locations(_path("client-ca", "crt", self.folder))
                ctx.verify_mode = ssl.CERT_OPTIONAL
                ctx.set_alpn_protocols(["http/1.1"])
                self._ctx, self._ctx_key = ctx, stamp
            return self._ctx

    def finish_request(self, request, client_address):
        request.settimeout(30)
        try:
            first = request.recv(1, socket.MSG_PEEK)
        except OSError:
            return
        if not first or first[0] != TLS_HANDSHAKE:
            request.settimeout(None)
            self.RequestHandlerClass(request, client_address, self)
            return
        try:
            secure = self.context().wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        try:
            secure.settimeout(None)
            self.RequestHandlerClass(secure, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                secure.close()
