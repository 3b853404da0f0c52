#!/usr/bin/env python3
"""Starts the coordinator and a worker with the command lines the units hold
(systemd's specifiers and environment expanded as systemd would, paths moved
into a temporary directory, the worker on the CPU through SHOAL_WORKER_ARGS),
and checks the coordinator's readiness notification on a test socket standing
in for NOTIFY_SOCKET: READY=1 only once the worker has registered and HTTP
answers, WATCHDOG=1 pings, STOPPING=1 on SIGTERM, and exit status 0.

    test_notify.py SOURCE_DIR COORDINATOR WORKER MAKE_DEMO TOKENIZER_DIR"""
import os, re, shlex, signal, socket, subprocess, sys, tempfile, time, urllib.request

src, coord, worker, make_demo, tokdir = sys.argv[1:6]
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

failures = []
coord_argv = exec_start("shoal-coordinator.service", "", env)
worker_argv = exec_start("shoal-worker@.service", "0", env)
print("coordinator:", " ".join(coord_argv))
print("worker:", " ".join(worker_argv))
c = subprocess.Popen(coord_argv, env=penv)
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
w = subprocess.Popen(worker_argv, env=penv)
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
c.send_signal(signal.SIGTERM)
rc = c.wait(timeout=60)
drain(0.3)
if not any("STOPPING=1" in m for m in msgs):
    failures.append("no STOPPING=1 on SIGTERM")
if rc != 0:
    failures.append("coordinator exit status %d after SIGTERM" % rc)
w.kill()
w.wait()
print("notifications:", [m.replace("\n", " ") for m in msgs][:6], "...")
for f in failures:
    print("FAIL:", f)
subprocess.run(["rm", "-rf", tmp])
print("%d passed, %d failed" % (0 if failures else 1, 1 if failures else 0))
sys.exit(1 if failures else 0)
