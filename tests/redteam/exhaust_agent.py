"""An exhausting agent: fills its container's disk, files, pids (and memory), then does normal work.

It runs inside the agent container (``python3 /data/public/exhaust_agent.py [memory]``, with
``pid_bomb.py`` beside it). Each step is
what a careless or hostile agent does to its container, in the places an agent would:

1. (without ``memory``) a 1.2 GB file in the workspace, then as much in /tmp (a tmpfs: charged to
   the container's memory, it stops at its size) and in /dev/shm (docker's 64 MiB);
2. (without ``memory``) 5,200 small files in ``many/``: more than a sealed submission lists;
3. tries to take itself out of the OOM killer's reach (``oom_score_adj`` -1000);
4. with ``memory`` only, a memory bomb: processes of 8 MiB each, forked until the kernel's OOM
   killer kills one (or a fork is refused): memory spread over many small processes, so that none of
   them is much larger than the recorder's shim;
5. a fork bomb (``pid_bomb``): threads until the pids limit refuses one; while every pid is taken,
   a blocking TCP connect to the recording proxy (the shim must record it without a thread of its
   own); then the threads and the memory bomb's processes are let go;
6. normal work: a model call through the recording proxy, a shell command, its submission
   (``out/submission.json``), and exit 0.

What each step did is written to ``out/exhaust.json``; the tests read it from the sealed submission.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

from pid_bomb import take_every_pid

OUT: dict[str, object] = {}
HUGE_MB = 1200
FILES = 5200
CHILD_MB = 8
MEMORY = sys.argv[1:] == ["memory"]
MAX_CHILDREN = 400


def step(name, fn, *args):
    t0 = time.monotonic()
    try:
        result = fn(*args)
    except Exception as e:  # a step that fails is a fact too: the agent goes on
        result = {"error": f"{type(e).__name__}: {e}"[:300]}
    result["s"] = round(time.monotonic() - t0, 2)
    OUT[name] = result
    print(f"exhaust: {name}: {result}", file=sys.stderr, flush=True)
    return result


def huge(path):
    chunk = b"\xa5" * (1 << 20)
    written, err = 0, None
    try:
        with open(path, "wb") as f:
            while written < HUGE_MB << 20:
                f.write(chunk)
                written += len(chunk)
    except OSError as e:
        err = e.strerror
    return {"written_mb": written >> 20, "error": err}


def many_files():
    os.makedirs("many", exist_ok=True)
    for i in range(FILES):
        with open(f"many/f{i:05d}.txt", "w") as f:
            f.write(f"small file {i}\n")
    return {"files": FILES}


def oom_immunity():
    with open("/proc/self/oom_score_adj") as f:
        before = f.read().strip()
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("-1000")
        err = None
    except OSError as e:
        err = e.strerror
    with open("/proc/self/oom_score_adj") as f:
        return {"before": before, "after": f.read().strip(), "error": err}


def memory_bomb(held):
    """Children that each hold CHILD_MB until the parent lets go (EOF on a pipe)."""
    release_r, release_w = os.pipe()
    children: list[int] = []
    oom_killed, fork_err = 0, None
    while len(children) < MAX_CHILDREN and not oom_killed:
        try:
            pid = os.fork()
        except OSError as e:
            fork_err = e.strerror
            break
        if pid == 0:
            os.close(release_w)
            ballast = b"\xa5" * (CHILD_MB << 20)  # touched: resident, charged to the container
            os.read(release_r, 1)
            os._exit(0 if ballast else 1)
        children.append(pid)
        for child in list(children):  # reap whatever the OOM killer took
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                children.remove(child)
                oom_killed += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    os.close(release_r)
    held["children"], held["release"] = children, release_w
    return {"children": len(children), "oom_killed": oom_killed, "fork_error": fork_err}


def fork_bomb(held):
    stop, threads, err = take_every_pid()
    # Every pid is taken: a blocking connect now (no timeout: the socket stays blocking).
    proxy = os.environ["HTTP_PROXY"].split("//")[1]
    host, port = proxy.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.connect((host, int(port)))
        connected = f"{host}:{port}"
    except OSError as e:
        connected = f"{host}:{port}: {e.strerror}"
    finally:
        s.close()
    stop.set()
    for t in threads:
        t.join()
    os.close(held["release"])  # the memory bomb's processes end
    for child in held["children"]:
        os.waitpid(child, 0)
    return {"threads": len(threads), "error": err, "connected": connected}


def model_call():
    import openai

    r = openai.OpenAI().chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "after the bombs"}]
    )
    return {"text": r.choices[0].message.content}


def shell():
    p = subprocess.run(["bash", "-c", "ls many | wc -l"], capture_output=True, timeout=60)
    return {"exit": p.returncode, "out": p.stdout.decode().strip()}


held: dict[str, object] = {"children": [], "release": os.open("/dev/null", os.O_RDONLY)}
if not MEMORY:  # (the memory bomb needs neither; the run without it covers both)
    step("huge_workspace", huge, "huge.bin")
    step("huge_tmp", huge, "/tmp/huge.bin")
    step("huge_shm", huge, "/dev/shm/huge.bin")
    step("many_files", many_files)
step("oom_immunity", oom_immunity)
if MEMORY:
    step("memory_bomb", memory_bomb, held)
step("fork_bomb", fork_bomb, held)
answer = step("model_call", model_call)
step("shell", shell)

os.makedirs("out", exist_ok=True)
with open("out/exhaust.json", "w") as f:
    json.dump(OUT, f)
with open("out/submission.json", "w") as f:
    json.dump({"answer": answer.get("text")}, f)
sys.exit(0)
