#!/usr/bin/env python3
"""Starts the coordinator and a worker with the command lines the units hold
(systemd's specifiers and environment expanded as systemd would, paths moved
into a temporary directory, the cluster name `shoal` made unique to this run,
the worker on the CPU through SHOAL_WORKER_ARGS), and checks the
coordinator's readiness notification on a test socket standing in for
NOTIFY_SOCKET: READY=1 only once the worker has registered and HTTP answers,
WATCHDOG=1 pings, STOPPING=1 on SIGTERM, and exit status 0. The worker joins
the cluster's segment (`shoalctl workers` shows it ready); `shoalctl drain 0`
ends it with status 0 and `undrain` says to start its unit, after which it
is back; after the stop shoalctl finds no cluster. Then the other order, as systemd may start them
(the units are not ordered): the worker first, the coordinator a moment
later, and READY=1 still comes.

    test_notify.py SOURCE_DIR COORDINATOR WORKER MAKE_DEMO TOKENIZER_DIR SHOALCTL"""
import atexit, json, os, re, shlex, signal, socket, subprocess, sys, tempfile, time, urllib.request

failures = []

src, coord, worker, make_demo, tokdir, shoalctl = sys.argv[1:7]
cluster = "notify-%d" % os.getpid()
tmp = tempfile.mkdtemp(prefix="shoal-notify.")
model = os.path.join(tmp, "model")
subprocess.run([make_demo, "--out", model, "--tokenizer-dir", tokdir], check=True,
               stdout=subprocess.DEVNULL)
run_dir = os.path.join(tmp, "run")


def exec_start(unit, instance, env):
    text = open(os.path.join(src, "systemd", unit)).read().replace("\\\n", " ")
    line = re.search(r"^ExecStart=(.*)$", text, re.M).group(1)
    line = line.replace("%i", instance)
    line = line.replace("/usr/local/bin/shoal-coordinator", coord)
    line = line.replace("/usr/local/bin/shoal-worker", worker)
    line = line.replace("/run/shoal", run_dir)
    if "--cluster shoal " not in line:
        failures.append("%s: ExecStart lacks --cluster shoal" % unit)
    line = line.replace("--cluster shoal ", "--cluster %s " % cluster)
    # systemd: ${VAR} is one word, $VAR splits into words
    line = re.sub(r"\$\{(\w+)\}", lambda m: shlex.quote(env[m.group(1)]), line)
    line = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], line)
    return shlex.split(line)


env = {"SHOAL_MODEL": model, "SHOAL_HOST": "127.0.0.1", "SHOAL_PORT": "0",
       "SHOAL_COORDINATOR_ARGS": "--port-file " + os.path.join(tmp, "port") + " --dead-after-ms 5000",
       "SHOAL_WORKER_ARGS": "--device cpu --threads 1 --kv-pages 64 --parallel 4"}
os.makedirs(run_dir, mode=0o700)
notify_path = os.path.join(tmp, "notify")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(notify_path)
sock.settimeout(0.2)
penv = dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="400000",
            SHOAL_API_KEY="")

coord_argv = exec_start("shoal-coordinator.service", "", env)
worker_argv = exec_start("shoal-worker@.service", "0", env)
print("coordinator:", " ".join(coord_argv))
print("worker:", " ".join(worker_argv))
started = []  # every process this test starts: killed at exit, even after an exception


def start(argv):
    p = subprocess.Popen(argv, env=penv)
    started.append(p)
    return p


atexit.register(lambda: [p.kill() for p in started if p.poll() is None])
c = start(coord_argv)
msgs = []


def drain(seconds):
    end = time.time() + seconds
    while time.time() < end:
        try:
            msgs.append(sock.recv(4096).decode())
        except socket.timeout:
            pass


drain(1.0)
if any("READY=1" in m for m in msgs):
    failures.append("READY=1 before any worker registered")
w = start(worker_argv)
end = time.time() + 120
while time.time() < end and not any("READY=1" in m for m in msgs):
    drain(0.2)
if not any("READY=1" in m for m in msgs):
    failures.append("no READY=1 within 120 s")
else:
    port = open(os.path.join(tmp, "port")).read().strip()
    health = urllib.request.urlopen("http://127.0.0.1:%s/health" % port, timeout=5).status
    if health != 200:
        failures.append("health %d after READY" % health)
    drain(1.0)
    if sum("WATCHDOG=1" in m for m in msgs) < 2:
        failures.append("fewer than two WATCHDOG=1 pings in a second at 400 ms")
    r = subprocess.run([shoalctl, "workers", "--json", "--sample", "0", "--cluster", cluster],
                       capture_output=True, text=True)
    ws = json.loads(r.stdout)["workers"] if r.returncode == 0 else []
    if not (len(ws) == 1 and ws[0]["index"] == 0 and ws[0]["state"] == "ready"
            and ws[0]["health"] == "ok" and ws[0]["pid"] == w.pid and not ws[0]["managed"]):
        failures.append("shoalctl workers does not show the unit's worker: exit %d %s %s"
                        % (r.returncode, r.stdout, r.stderr))
    # shoalctl drain on a worker systemd started: it exits 0 (so Restart=
    # on-failure leaves it stopped); undrain says to start its unit, and a
    # start (systemd's, here ours) brings it back
    d = subprocess.Popen([shoalctl, "drain", "0", "--cluster", cluster, "--timeout", "60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wrc = w.wait(timeout=60)  # reaped at once, as systemd does
        out, err = d.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        wrc, out, err = None, "", "timeout"
        d.kill()
    if wrc != 0 or d.returncode != 0 or "drained after" not in out:
        failures.append("drain of the unit's worker: worker exit %s, shoalctl exit %s: %s %s"
                        % (wrc, d.returncode, out, err))
    r = subprocess.run([shoalctl, "undrain", "0", "--cluster", cluster], capture_output=True,
                       text=True)
    if r.returncode != 0 or "systemctl start shoal-worker@0" not in r.stdout:
        failures.append("undrain of the unit's worker: exit %d: %s %s"
                        % (r.returncode, r.stdout, r.stderr))
    w = start(worker_argv)
    state = ""
    for _ in range(600):
        r = subprocess.run([shoalctl, "workers", "--json", "--sample", "0", "--cluster", cluster],
                           capture_output=True, text=True)
        ws = json.loads(r.stdout)["workers"] if r.returncode == 0 else []
        state = ws[0]["state"] if ws and ws[0]["pid"] == w.pid else state
        if state == "ready":
            break
        time.sleep(0.1)
    if state != "ready":
        failures.append("the unit's worker did not come back after undrain (%s)" % state)
c.send_signal(signal.SIGTERM)
rc = c.wait(timeout=60)
drain(0.3)
if not any("STOPPING=1" in m for m in msgs):
    failures.append("no STOPPING=1 on SIGTERM")
if rc != 0:
    failures.append("coordinator exit status %d after SIGTERM" % rc)
w.kill()
w.wait()
r = subprocess.run([shoalctl, "pages", "--cluster", cluster], capture_output=True, text=True)
if r.returncode != 1 or ("no cluster '%s' is running" % cluster) not in r.stderr:
    failures.append("shoalctl pages after the stop: exit %d: %s" % (r.returncode, r.stderr))
print("notifications:", [m.replace("\n", " ") for m in msgs][:6], "...")

# The other order: the worker waits for the coordinator's segment.
msgs.clear()
os.unlink(os.path.join(tmp, "port"))
w = start(worker_argv)
time.sleep(1.5)
if w.poll() is not None:
    failures.append("a worker started before its coordinator exited (%d)" % w.returncode)
c = start(coord_argv)
end = time.time() + 120
while time.time() < end and not any("READY=1" in m for m in msgs):
    drain(0.2)
if not any("READY=1" in m for m in msgs):
    failures.append("worker first: no READY=1 within 120 s")
c.send_signal(signal.SIGTERM)
try:
    rc = c.wait(timeout=60)
except subprocess.TimeoutExpired:
    c.kill()
    rc = c.wait()
if rc != 0:
    failures.append("worker first: coordinator exit status %d after SIGTERM" % rc)
w.kill()
w.wait()
for f in failures:
    print("FAIL:", f)
subprocess.run(["rm", "-rf", tmp])
print("%d passed, %d failed" % (0 if failures else 1, 1 if failures else 0))
sys.exit(1 if failures else 0)
