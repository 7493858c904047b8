"""The grader container: metric code and references, and no network at all.

Runs the real grader image the way the scorer does (``network_mode=none``, references and the
submission read-only) and checks from inside that there is no interface but loopback, no route
out, no writable reference, and that the metric code computes. Needs dockerd; never skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

PROBE = r"""
import json, os, socket
import numpy as np
from scorer.metrics.dice import multiclass_dice
out = {"interfaces": sorted(os.listdir("/sys/class/net"))}
for host, port in (("1.1.1.1", 443), ("172.17.0.1", 22)):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, port)); out[host] = "open"
    except OSError as e:
        out[host] = type(e).__name__
try:
    open("/data/private/ref.txt", "a").write("x"); out["reference_writable"] = True
except OSError:
    out["reference_writable"] = False
out["reference"] = open("/data/private/ref.txt").read()
pred = np.zeros((4, 4), np.uint8); pred[:2] = 1
ref = np.zeros((4, 4), np.uint8); ref[:1] = 1
out["dice"] = multiclass_dice(pred, ref, [1])[1]
print(json.dumps(out))
"""


def test_grader_has_no_network_and_read_only_references(
    tmp_path: Path, grader_image: str, docker_cli
) -> None:
    ref = tmp_path / "private"
    ref.mkdir()
    (ref / "ref.txt").write_text("reference")
    sub = tmp_path / "submission"
    sub.mkdir()
    out = docker_cli.containers.run(
        grader_image,
        ["python", "-c", PROBE],
        network_mode="none",
        read_only=True,
        remove=True,
        volumes={
            str(ref): {"bind": "/data/private", "mode": "ro"},
            str(sub): {"bind": "/agent_outputs", "mode": "ro"},
        },
        security_opt=["no-new-privileges"],
        cap_drop=["ALL"],
        tmpfs={"/tmp": "size=64m"},
    )
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["interfaces"] == ["lo"]
    assert result["1.1.1.1"] != "open" and result["172.17.0.1"] != "open"
    assert result["reference_writable"] is False and result["reference"] == "reference"
    assert abs(result["dice"] - 2 * 4 / (8 + 4)) < 1e-9  # 2|A∩B| / (|A|+|B|) = 8/12
