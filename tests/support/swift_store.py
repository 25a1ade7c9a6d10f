#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A real S3-compatible object store for the tests: OpenStack Swift (Debian's
python3-swift) with its s3api middleware, one node, one replica, on 127.0.0.1.

    swift_store.py [--dir DIR] [--max-lifetime SECONDS]

Starts memcached and the proxy, account, container and object servers (each
its own process, `workers = 0`) on ephemeral ports, in a fresh temporary
directory under DIR (default: $TMPDIR), with rings built in-process and a
swift.conf of its own (the servers read the fixed path
swift.common.utils.SWIFT_CONF_FILE, /etc/swift/swift.conf: each server
process here sets that module attribute to the temporary copy before the
server loads, so /etc is never read or written). When a request has gone
through every server, prints one line on stdout:

    ready endpoint=http://127.0.0.1:PORT access_key=test:tester secret_key=testing region=us-east-1 proxy_pid=PID dir=DIR netrc=DIR/netrc ready_s=SECONDS

then reads commands on stdin, one a line, each answered by one line:

    bucket NAME   creates the bucket NAME (a Swift container): "ok" or "error: WHY"
    requests      the requests clients made so far (the harness's own not
                  counted), from the proxy's access log: "ok total=N GET=N HEAD=N ..."
    stop          stops every server, removes the directory, exits 0

End of input (the parent died or closed the pipe) is `stop`; so is the end
of the maximum lifetime (default 1800 s). The servers die with the harness
even when it is killed (PR_SET_PDEATHSIG). Every wait is bounded: the ready
check gives up after 60 s, each request after 30 s.
"""

import argparse
import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ACCOUNT = "test"
USER = "tester"
PASSWORD = "testing"
REGION = "us-east-1"
SERVERS = ("account", "container", "object", "proxy")
READY_TIMEOUT_S = 60
# Debian's interpreter, the one python3-swift is installed for.
DEBIAN_PYTHON = "/usr/bin/python3"
REQUEST_TIMEOUT_S = 30

SWIFT_CONF = """\
[swift-hash]
swift_hash_path_suffix = kvfile-tests
swift_hash_path_prefix = kvfile-tests

[storage-policy:0]
name = only
default = yes
"""

COMMON = """\
[DEFAULT]
swift_dir = {dir}
devices = {dir}/srv
mount_check = false
disable_fallocate = true
workers = 0
bind_ip = 127.0.0.1
bind_port = {port}
log_level = WARNING
log_name = swift-{name}
eventlet_debug = false
"""

SERVER_CONF = {
    "account": "[pipeline:main]\npipeline = account-server\n\n"
               "[app:account-server]\nuse = egg:swift#account\n",
    "container": "[pipeline:main]\npipeline = container-server\n\n"
                 "[app:container-server]\nuse = egg:swift#container\n",
    "object": "[pipeline:main]\npipeline = object-server\n\n"
              "[app:object-server]\nuse = egg:swift#object\n",
    # s3api before the auth (tempauth), slo after it (s3api's multipart
    # uploads are SLOs); cache (memcached) holds tempauth's tokens. The
    # proxy adds what else it requires (listing_formats, copy, dlo, ...).
    "proxy": """\
[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy-logging cache s3api tempauth slo dlo proxy-logging proxy-server

[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
allow_account_management = true

[filter:catch_errors]
use = egg:swift#catch_errors

[filter:gatekeeper]
use = egg:swift#gatekeeper

[filter:healthcheck]
use = egg:swift#healthcheck

[filter:proxy-logging]
use = egg:swift#proxy_logging
# Every request's line, to the harness's request counter.
access_log_level = INFO
access_log_udp_host = 127.0.0.1
access_log_udp_port = {counter_port}
log_msg_template = kvfile-request {{method}} {{status_int}} {{source}} {{path}}

[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:{memcached_port}

[filter:s3api]
use = egg:swift#s3api
location = {region}
s3_acl = false
check_bucket_owner = false

[filter:tempauth]
use = egg:swift#tempauth
user_{account}_{user} = {password} .admin

[filter:slo]
use = egg:swift#slo

[filter:dlo]
use = egg:swift#dlo
""",
}


def die_with_parent():
    """preexec_fn: SIGKILL this child when the harness dies, however it dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def listening_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    return s


def build_rings(swift_dir, ports):
    """One device, one replica, per ring: the rings swift-ring-builder would
    write, built with its library."""
    from swift.common.ring import RingBuilder
    for kind in ("account", "container", "object"):
        b = RingBuilder(6, 1, 1)
        b.add_dev({"id": 0, "region": 1, "zone": 1, "ip": "127.0.0.1", "port": ports[kind],
                   "device": "d0", "weight": 100, "meta": ""})
        b.rebalance()
        b.get_ring().save(os.path.join(swift_dir, kind + ".ring.gz"))


def serve(kind, conf_path, fd):
    """The body of one server process: Swift's own runner (run_wsgi, in the
    foreground since workers = 0) on the socket the harness bound."""
    from swift.common import utils
    utils.SWIFT_CONF_FILE = os.path.join(os.path.dirname(conf_path), "swift.conf")
    from swift.common import constraints, storage_policy, wsgi
    constraints.reload_constraints()
    storage_policy.reload_storage_policies()

    def inherited_socket(conf):
        from eventlet.greenio import GreenSocket
        return GreenSocket(socket.socket(fileno=fd))

    wsgi.get_socket = inherited_socket
    section = "proxy-server" if kind == "proxy" else kind + "-server"
    sys.exit(wsgi.run_wsgi(conf_path, section, verbose=True))


def request(port, method, path, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        r.read()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders())
    finally:
        c.close()


class RequestCounter:
    """Counts the requests clients made of the store, by method, from the
    proxy's access log lines (sent to a UDP socket of the harness). A line
    of a client's request has no swift.source ("-", "None"); those of the
    subrequests a middleware makes (s3api's, slo's) name it, and so do the
    harness's own requests (its bucket command, its sentinel)."""

    def __init__(self, store):
        self.store = store
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.counts = {}
        self.sentinels = 0
        self.cond = threading.Condition()
        threading.Thread(target=self.receive, daemon=True).start()

    def receive(self):
        while True:
            try:
                line = self.sock.recv(65536).decode("utf-8", "replace")
            except OSError:
                return
            words = line[line.find("kvfile-request "):].split()
            if len(words) < 5:
                continue
            method, source, path = words[1], words[3], words[4]
            with self.cond:
                if path.startswith("/kvfile-sentinel"):
                    self.sentinels += 1
                    self.cond.notify_all()
                elif source in ("-", "None") and not path.startswith(("/v1/", "/auth/")):
                    self.counts[method] = self.counts.get(method, 0) + 1

    def snapshot(self):
        """The counts once every request answered so far is counted: a
        sentinel request's line arrives after theirs."""
        with self.cond:
            want = self.sentinels + 1
        request(self.store.proxy_port, "HEAD", "/kvfile-sentinel")
        deadline = time.monotonic() + 10
        with self.cond:
            while self.sentinels < want and time.monotonic() < deadline:
                self.cond.wait(0.1)
            if self.sentinels < want:
                return "error: the proxy's log line did not arrive"
            total = sum(self.counts.values())
            return "ok total=%d %s" % (total, " ".join("%s=%d" % kv for kv in sorted(self.counts.items())))


class Store:
    def __init__(self, parent_dir):
        self.dir = tempfile.mkdtemp(prefix="kvfile-swift-", dir=parent_dir)
        self.procs = []
        self.token = None
        self.lock = threading.RLock()  # stop() from a signal handler during stop()

    def start(self):
        os.makedirs(os.path.join(self.dir, "srv", "d0"))
        with open(os.path.join(self.dir, "swift.conf"), "w") as f:
            f.write(SWIFT_CONF)
        socks = {k: listening_socket() for k in SERVERS}
        ports = {k: s.getsockname()[1] for k, s in socks.items()}
        self.proxy_port = ports["proxy"]
        self.counter = RequestCounter(self)
        build_rings(self.dir, ports)
        memcached_port = self.start_memcached()
        for kind in SERVERS:
            conf = os.path.join(self.dir, kind + "-server.conf")
            with open(conf, "w") as f:
                f.write(COMMON.format(dir=self.dir, name=kind, port=ports[kind]))
                f.write("\n" + SERVER_CONF[kind].format(
                    memcached_port=memcached_port, counter_port=self.counter.port, region=REGION, account=ACCOUNT, user=USER,
                    password=PASSWORD))
            fd = socks[kind].fileno()
            log = open(os.path.join(self.dir, kind + ".log"), "wb")
            self.procs.append(subprocess.Popen(
                [DEBIAN_PYTHON, os.path.abspath(__file__), "--serve", kind, conf, str(fd)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(fd,),
                preexec_fn=die_with_parent))
            log.close()
            socks[kind].close()
            if kind == "proxy":
                self.proxy_pid = self.procs[-1].pid

    def start_memcached(self):
        """memcached on a free port: it cannot take a bound socket, so a port
        is picked, and another if it was taken meanwhile (5 tries)."""
        for _ in range(5):
            probe = listening_socket()
            port = probe.getsockname()[1]
            probe.close()
            cmd = ["memcached", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "64"]
            if os.getuid() == 0:
                cmd += ["-u", "root"]  # it refuses to run as root without this
            p = subprocess.Popen(cmd,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and p.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    self.procs.append(p)
                    return port
                except OSError:
                    time.sleep(0.01)
            p.kill()
            p.wait()
        raise RuntimeError("memcached did not start")

    def auth(self):
        status, h = request(self.proxy_port, "GET", "/auth/v1.0",
                            {"X-Auth-User": ACCOUNT + ":" + USER, "X-Auth-Key": PASSWORD})
        if status != 200:
            raise RuntimeError("tempauth answered %d" % status)
        self.token = h["x-auth-token"]

    def swift(self, method, path):
        return request(self.proxy_port, method, "/v1/AUTH_" + ACCOUNT + path, {"X-Auth-Token": self.token})[0]

    def wait_ready(self):
        """One request through every server: a container (account and
        container servers) holding an object (object server), then removed."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError("a server exited with status %d (logs in %s)" % (p.returncode, self.dir))
            try:
                self.auth()
                if (self.swift("PUT", "/ready-check") in (201, 202)
                        and self.swift("PUT", "/ready-check/o") == 201
                        and self.swift("DELETE", "/ready-check/o") == 204
                        and self.swift("DELETE", "/ready-check") == 204):
                    return
            except (OSError, RuntimeError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("not ready after %d s (logs in %s)" % (READY_TIMEOUT_S, self.dir))
            time.sleep(0.05)

    def write_netrc(self):
        """DIR/netrc: the credentials for curl --aws-sigv4 (its --user cuts
        the access key at its first ':')."""
        with open(os.path.join(self.dir, "netrc"), "w") as f:
            f.write("machine 127.0.0.1\nlogin %s:%s\npassword %s\n" % (ACCOUNT, USER, PASSWORD))

    def create_bucket(self, name):
        status = self.swift("PUT", "/" + name)
        if status not in (201, 202):
            return "error: PUT container %s answered %d" % (name, status)
        return "ok"

    def print_logs(self):
        """The servers' logs, on stderr (before the directory goes)."""
        for kind in SERVERS:
            try:
                with open(os.path.join(self.dir, kind + ".log"), errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            if text:
                sys.stderr.write("== %s server\n%s" % (kind, text[-4000:]))

    def stop(self):
        with self.lock:
            for p in self.procs:
                if p.poll() is None:
                    p.terminate()
            for p in self.procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            self.procs = []
            shutil.rmtree(self.dir, ignore_errors=True)


class Harness:
    """The client side of the protocol above, for Python tests (the pytest
    fixture swift_store in tests/python/conftest.py):

        h = Harness(tmp_dir)        # started and ready, or RuntimeError
        h.bucket("kvtest")
        env = h.env()               # AWS_* for a child process
        h.stop()
    """

    def __init__(self, parent_dir=None, timeout_s=180):
        cmd = [DEBIAN_PYTHON, os.path.abspath(__file__)]
        if parent_dir is not None:
            cmd += ["--dir", str(parent_dir)]
        # Not under the sanitizer runtime the ASan pass preloads into the
        # test's interpreter: Swift is no code of kvfile's.
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=lambda: ctypes.CDLL(None).prctl(1, signal.SIGTERM))
        line = self._read_line(timeout_s)
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError("the Swift harness did not start (its stderr is the test's)")
        self.fields = dict(w.split("=", 1) for w in line.split()[1:])
        self.endpoint = self.fields["endpoint"]
        self.access_key = self.fields["access_key"]
        self.secret_key = self.fields["secret_key"]
        self.region = self.fields["region"]
        self.proxy_pid = int(self.fields["proxy_pid"])
        self.ready_seconds = float(self.fields["ready_s"])

    def _read_line(self, timeout_s):
        import selectors
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                return ""
        return self.proc.stdout.readline()

    def bucket(self, name):
        """Creates bucket `name` (3 to 63 characters) through Swift's own API."""
        self.proc.stdin.write("bucket %s\n" % name)
        self.proc.stdin.flush()
        answer = self._read_line(60).strip()
        if answer != "ok":
            raise RuntimeError("creating bucket %s: %s" % (name, answer))
        return name

    def requests(self):
        """The requests clients made of the store so far, by method, and
        their "total" (the harness's own not counted)."""
        self.proc.stdin.write("requests\n")
        self.proc.stdin.flush()
        answer = self._read_line(60).split()
        if answer[:1] != ["ok"]:
            raise RuntimeError("counting requests: %s" % " ".join(answer))
        return {k: int(v) for k, v in (w.split("=", 1) for w in answer[1:])}

    def curl_args(self):
        """The arguments that make curl sign its requests for this store."""
        return ["--aws-sigv4", "aws:amz:%s:s3" % self.region, "--netrc-file", self.fields["netrc"],
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]

    def env(self, base=None):
        """`base` (default os.environ) with the AWS variables of this store
        (and without the ASan pass's LD_PRELOAD: the children are awscli or
        kvfile, which links its own)."""
        env = dict(os.environ if base is None else base)
        for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "LD_PRELOAD", "ASAN_OPTIONS"):
            env.pop(k, None)
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key,
                   AWS_REGION=self.region, AWS_DEFAULT_REGION=self.region, AWS_ENDPOINT_URL=self.endpoint)
        return env

    def boto3(self):
        """A boto3 S3 client of this store (path-style addressing)."""
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region,
                            config=Config(s3={"addressing_style": "path"}))

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--max-lifetime", type=float, default=1800)
    args = ap.parse_args()
    started = time.monotonic()
    store = Store(args.dir)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: (store.stop(), os._exit(0)))
    try:
        store.start()
        store.wait_ready()
        store.write_netrc()
    except Exception as e:  # one line on stderr, nothing left running
        print("swift_store: %s" % e, file=sys.stderr)
        store.print_logs()
        store.stop()
        return 2
    timer = threading.Timer(args.max_lifetime, lambda: (store.stop(), os._exit(0)))
    timer.daemon = True
    timer.start()
    print("ready endpoint=http://127.0.0.1:%d access_key=%s:%s secret_key=%s region=%s proxy_pid=%d "
          "dir=%s netrc=%s/netrc ready_s=%.2f" % (store.proxy_port, ACCOUNT, USER, PASSWORD, REGION, store.proxy_pid,
                                                  store.dir, store.dir, time.monotonic() - started), flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["bucket"] and len(words) == 2:
            try:
                print(store.create_bucket(words[1]), flush=True)
            except (OSError, http.client.HTTPException) as e:
                print("error: %s" % e, flush=True)
        elif words == ["requests"]:
            print(store.counter.snapshot(), flush=True)
        elif words == ["stop"]:
            break
        else:
            print("error: unknown command", flush=True)
    store.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
