"""amb_kit: the baseline kit's pipeline: run a track's method on a case, and check what it wrote.

The scripted baseline policy writes this file into the agent's workspace as ``amb_kit.py``, beside
the library it builds on (``kit_lib.py``, shipped as ``amb_kit_lib.py``), whose names it also offers,
so the agent's code imports one module. Standard library only, like the library.
"""

import json
import math
import os
import time

if __package__:  # imported from this repository, as agents.baseline.kit
    from agents.baseline import kit_lib as lib
else:  # amb_kit.py in the agent's workspace, beside amb_kit_lib.py
    import amb_kit_lib as lib  # type: ignore[no-redef]  # kit_lib under its shipped name (a file there)


def __getattr__(name: str):
    """``amb_kit.X`` is the library's X for every name the pipeline does not define itself: the
    agent's code calls the readers, writers and configuration helpers on the one module."""
    return getattr(lib, name)


def check_case(cfg, case):
    """What a careful agent looks at after writing a case: files exist, shape and values are sane."""
    src = os.path.join(cfg["data"], case)
    report = {"case": case, "ok": True, "problems": []}

    def bad(msg):
        report["ok"] = False
        report["problems"].append(msg)

    for path in lib.output_paths(cfg, case):
        if not os.path.isfile(path):
            bad("missing " + path)
            continue
        track = cfg["track"]
        if track == "segmentation":
            ref = lib.read_nifti(os.path.join(src, cfg["input_file"]))
            out = lib.read_nifti(path)
            labels = sorted(set(out.values))
            report[os.path.basename(path)] = {
                "shape": list(out.shape),
                "labels": labels,
                "voxels": sum(1 for v in out.values if v),
            }
            if out.shape != ref.shape:
                bad(f"{path}: shape {out.shape} != input {ref.shape}")
            allowed = set([0] + list(cfg.get("label_ids") or [1]))
            if not set(labels) <= allowed:
                bad(f"{path}: unexpected labels {labels}")
        elif track == "enhancement":
            shape, values = lib.read_npy(path)
            in_shape, _ = lib.read_npy(os.path.join(src, cfg["input_file"]))
            want = tuple(s * cfg.get("scale", 1) for s in in_shape)
            finite = all(math.isfinite(v) for v in values)
            report[os.path.basename(path)] = {
                "shape": list(shape),
                "min": min(values),
                "max": max(values),
                "finite": finite,
            }
            if shape != want:
                bad(f"{path}: shape {shape} != expected {want}")
            if not finite:
                bad(path + ": NaN or Inf values")
        elif track in ("vqa", "detection"):
            with open(path) as f:
                data = json.load(f)
            if track == "vqa":
                missing = [
                    k
                    for k in (
                        "question_id",
                        "predicted_label",
                        "predicted_answer",
                        "raw_model_output",
                        "model_name",
                        "runtime_s",
                    )
                    if k not in data
                ]
                if missing:
                    bad(f"{path}: missing keys {missing}")
                report["answer"] = data.get("predicted_label") or data.get("predicted_answer")
            else:
                boxes = data.get("boxes")
                if not isinstance(boxes, list):
                    bad(path + ": no boxes list")
                else:
                    report["boxes"] = len(boxes)
                    if any(b["x2"] <= b["x1"] or b["y2"] <= b["y1"] for b in boxes):
                        bad(path + ": empty or inverted box")
        elif track == "report":
            with open(path) as f:
                text = f.read()
            report["chars"] = len(text)
            if len(text) < cfg.get("min_chars", 1):
                bad(f"{path}: only {len(text)} characters")
    return report


def run_case(cfg, case):
    """Run the track's method on one case; returns the files written."""
    src = os.path.join(cfg["data"], case)
    outs = lib.output_paths(cfg, case)
    track = cfg["track"]
    t0 = time.time()
    if track == "segmentation":
        vol = lib.read_nifti(os.path.join(src, cfg["input_file"]))
        if cfg["mode"] == "binary":
            window = cfg.get("window")
            organ, lesion = lib.segment_binary(vol, tuple(window) if window else None, cfg.get("keep", 1))
            for path, kind in zip(outs, cfg["kinds"], strict=False):
                lib.write_nifti(path, vol, lesion if kind == "lesion" else organ)
        else:
            lib.write_nifti(outs[0], vol, lib.segment_multiclass(vol, cfg["label_ids"]))
    elif track == "enhancement":
        shape, values = lib.read_npy(os.path.join(src, cfg["input_file"]))
        if cfg["kind"] == "super_resolution":
            shape, values = lib.upsample(shape, values, cfg["scale"])
        else:
            values = lib.smooth(shape, values, passes=cfg.get("passes", 1))
        lib.write_npy(outs[0], shape, values)
    elif track == "vqa":
        with open(os.path.join(src, cfg["question_file"])) as f:
            question = json.load(f)
        label, answer = lib.vqa_prior(question)
        record = {
            "question_id": question.get("question_id", case),
            "predicted_label": label,
            "predicted_answer": answer,
            "raw_model_output": "answer prior for {} questions: {}".format(
                question.get("question_type") or "these", label or answer
            ),
            "model_name": lib.VERSION + " answer prior",
            # At 0.1 s (a table lookup reads 0.0): the answer file is then the same on every run,
            # so a replayed run seals the same submission.
            "runtime_s": round(time.time() - t0, 1),
        }
        lib.write_file(outs[0], record)
    elif track == "report":
        with open(os.path.join(src, cfg["manifest_file"])) as f:
            manifest = json.load(f)
        lib.write_file(outs[0], lib.report_template(manifest, cfg["style"], cfg["section"]))
    elif track == "detection":
        width, height, gray = lib.read_png_gray(os.path.join(src, cfg["input_file"]))
        lib.write_file(outs[0], {"boxes": lib.detect_blobs(width, height, gray, cfg["classes"])})
    else:
        raise ValueError(f"unknown track {track!r}")
    return outs
