"""amb_kit_lib: the baseline kit's library: file formats, classical methods and the pipeline
configuration (``pipeline.json``), in the Python standard library only.

The scripted baseline policy writes this file into the agent's workspace as ``amb_kit_lib.py``
(see ``kit.py``). It must run in a bare agent container that has Python and nothing else, so it
reads and writes NIfTI-1, ``.npy`` and PNG itself instead of importing numpy. The methods are
deliberately classical and weak, and honest: every output is computed from the case's public input.
"""

import array
import gzip
import json
import math
import os
import struct
import sys
import zlib
from collections import deque

VERSION = "amb-kit-1"

# ---- NIfTI-1 ------------------------------------------------------------------------------------

_NIFTI_TYPES = {
    2: ("B", 1),
    4: ("h", 2),
    8: ("i", 4),
    16: ("f", 4),
    64: ("d", 8),
    256: ("b", 1),
    512: ("H", 2),
    768: ("I", 4),
}


class Volume:
    def __init__(self, header, endian, shape, spacing, values):
        self.header = header
        self.endian = endian
        self.shape = shape
        self.spacing = spacing
        self.values = values

    @property
    def dtype(self):
        return "float" if any(isinstance(v, float) for v in self.values[:64]) else "int"


def read_nifti(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    endian = "<" if struct.unpack("<i", raw[:4])[0] == 348 else ">"
    if struct.unpack(endian + "i", raw[:4])[0] != 348:
        raise ValueError(path + ": not a NIfTI-1 file")
    dim = struct.unpack(endian + "8h", raw[40:56])
    shape = tuple(dim[1 : 1 + dim[0]])
    datatype = struct.unpack(endian + "h", raw[70:72])[0]
    pixdim = struct.unpack(endian + "8f", raw[76:108])
    offset = int(struct.unpack(endian + "f", raw[108:112])[0])
    slope, inter = struct.unpack(endian + "ff", raw[112:120])
    if datatype not in _NIFTI_TYPES:
        raise ValueError(f"{path}: unsupported NIfTI datatype {datatype}")
    code, size = _NIFTI_TYPES[datatype]
    n = 1
    for s in shape:
        n *= s
    data = array.array(code)
    data.frombytes(raw[offset : offset + n * size])
    if (endian == "<") != (sys.byteorder == "little"):
        data.byteswap()
    values = data.tolist()
    if slope and not math.isnan(slope) and (slope != 1.0 or inter != 0.0):
        values = [v * slope + inter for v in values]
    return Volume(raw[:348], endian, shape, tuple(round(p, 4) for p in pixdim[1 : 1 + dim[0]]), values)


def write_nifti(path, like, values):
    """A uint8 NIfTI-1 on the voxel grid (header, affine) of ``like``."""
    hdr = bytearray(like.header)
    e = like.endian
    struct.pack_into(e + "hh", hdr, 70, 2, 8)  # datatype uint8, bitpix 8
    struct.pack_into(e + "f", hdr, 108, 352.0)  # vox_offset
    struct.pack_into(e + "ff", hdr, 112, 1.0, 0.0)  # scl_slope, scl_inter
    struct.pack_into(e + "ff", hdr, 124, 0.0, 0.0)  # cal_max, cal_min
    body = bytes(hdr) + b"\0\0\0\0" + array.array("B", values).tobytes()
    # mtime=0: gzip would stamp the time of writing into the header, so the same mask written
    # twice (a replayed run) would not be the same file.
    write_file(path, gzip.compress(body, compresslevel=6, mtime=0))


def components(mask, shape, min_size=1):
    """Connected components (6-connectivity in 3-D, 4 in 2-D) of a 0/1 list; largest first."""
    nx = shape[0]
    ny = shape[1] if len(shape) > 1 else 1
    nz = shape[2] if len(shape) > 2 else 1
    seen = bytearray(len(mask))
    steps = [1, -1, nx, -nx] + ([nx * ny, -nx * ny] if nz > 1 else [])
    comps = []
    for start in range(len(mask)):
        if not mask[start] or seen[start]:
            continue
        seen[start] = 1
        queue = deque([start])
        members = []
        while queue:
            i = queue.popleft()
            members.append(i)
            x = i % nx
            for s in steps:
                j = i + s
                if j < 0 or j >= len(mask) or seen[j] or not mask[j]:
                    continue
                if (s == 1 and x == nx - 1) or (s == -1 and x == 0):
                    continue
                if abs(s) == nx and ((j // nx) % ny != (i // nx) % ny + (1 if s > 0 else -1)):
                    continue
                seen[j] = 1
                queue.append(j)
        if len(members) >= min_size:
            comps.append(members)
    comps.sort(key=len, reverse=True)
    return comps


def mean_std(values):
    if not values:
        return 0.0, 0.0
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def segment_binary(vol, window=(85.0, 300.0), keep=1, lesion_sigma=1.0):
    """Organ = the ``keep`` largest enhancing soft-tissue components, grown by one voxel into
    tissue above the body's level; lesion = darker blobs inside the organ's extent."""
    if window is None:  # not CT: no fixed scale, so "brighter than the body's own tissue level"
        thr = otsu(vol.values)
        body = sorted(v for v in vol.values if v > thr)
        med = body[len(body) // 2]
        mad = sorted(abs(v - med) for v in body)[len(body) // 2]
        window = (med + 4.0 * mad, body[-1])
    lo, hi = window
    tissue = [1 if lo <= v <= hi else 0 for v in vol.values]
    comps = components(tissue, vol.shape, min_size=20)[:keep]
    organ = bytearray(len(tissue))
    for comp in comps:
        for i in comp:
            organ[i] = 1
    inside = [vol.values[i] for i in range(len(organ)) if organ[i]]
    m, s = mean_std(inside)
    floor = lo - 0.6 * (m - lo) if inside else lo
    nx = vol.shape[0]
    ny = vol.shape[1]
    steps = (1, -1, nx, -nx, nx * ny, -nx * ny)
    for _ in range(2):  # grow into the darker rim and any lesion that the window cut out
        grown = bytearray(organ)
        for i in range(len(organ)):
            if organ[i] or not (floor <= vol.values[i] <= hi):
                continue
            if any(0 <= i + d < len(organ) and organ[i + d] for d in steps):
                grown[i] = 1
        organ = grown
    core = organ
    for _ in range(2):  # look for lesions away from the organ's boundary (partial-volume rim)
        core = bytearray(
            1 if core[i] and all(0 <= i + d < len(core) and core[i + d] for d in steps) else 0
            for i in range(len(core))
        )
    dark = [1 if core[i] and vol.values[i] < m - lesion_sigma * s else 0 for i in range(len(organ))]
    lesion = bytearray(len(organ))
    for comp in components(dark, vol.shape, min_size=8)[:1]:
        for i in comp:
            lesion[i] = 1
    return organ, lesion


def segment_multiclass(vol, label_ids):
    """Foreground by Otsu's threshold, then intensity quantile bins mapped to the label ids."""
    fg_thr = otsu(vol.values)
    fg = [v for v in vol.values if v > fg_thr]
    if not fg:
        return bytearray(len(vol.values))
    ordered = sorted(fg)
    k = len(label_ids)
    cuts = [ordered[min(len(ordered) - 1, (len(ordered) * q) // k)] for q in range(1, k)]
    out = bytearray(len(vol.values))
    ranked = list(reversed(label_ids))  # brightest bin gets the first label
    for i, v in enumerate(vol.values):
        if v > fg_thr:
            b = 0
            while b < len(cuts) and v > cuts[b]:
                b += 1
            out[i] = ranked[min(b, k - 1)] % 256
    return out


def otsu(values, bins=64):
    lo, hi = min(values), max(values)
    if hi <= lo:
        return lo
    hist = [0] * bins
    for v in values:
        hist[min(bins - 1, int((v - lo) / (hi - lo) * bins))] += 1
    total = len(values)
    sum_all = sum(i * h for i, h in enumerate(hist))
    best, best_t, w0, sum0 = -1.0, 0, 0, 0.0
    for t in range(bins):
        w0 += hist[t]
        if w0 == 0 or w0 == total:
            continue
        sum0 += t * hist[t]
        m0, m1 = sum0 / w0, (sum_all - sum0) / (total - w0)
        between = w0 * (total - w0) * (m0 - m1) ** 2
        if between > best:
            best, best_t = between, t
    return lo + (best_t + 1) * (hi - lo) / bins


# ---- .npy ---------------------------------------------------------------------------------------


def read_npy(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:6] != b"\x93NUMPY":
        raise ValueError(path + ": not a .npy file")
    major = raw[6]
    hlen = struct.unpack("<H", raw[8:10])[0] if major == 1 else struct.unpack("<I", raw[8:12])[0]
    start = 10 if major == 1 else 12
    header = raw[start : start + hlen].decode("latin1")
    descr = header.split("'descr':")[1].split("'")[1]
    fortran = "True" in header.split("'fortran_order':")[1].split(",")[0]
    shape_text = header.split("'shape':")[1].split("(")[1].split(")")[0]
    shape = tuple(int(p) for p in shape_text.split(",") if p.strip())
    code = {"f4": "f", "f8": "d", "i2": "h", "i4": "i", "u1": "B", "u2": "H"}[descr[1:]]
    data = array.array(code)
    data.frombytes(raw[start + hlen :])
    if (descr[0] == ">") != (sys.byteorder == "big") and descr[0] in "<>":
        data.byteswap()
    values = [float(v) for v in data]
    if fortran and len(shape) == 2:
        h, w = shape
        values = [values[c * h + r] for r in range(h) for c in range(w)]
    return shape, values


def write_npy(path, shape, values):
    header = "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}".format(
        ", ".join(str(s) for s in shape)
    ) + ("," if len(shape) == 1 else "")
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    data = array.array("f", values)
    if sys.byteorder == "big":
        data.byteswap()
    write_file(
        path, b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + data.tobytes()
    )


def smooth(shape, values, passes=1):
    """3x3 binomial filter ([1 2 1] x [1 2 1] / 16), edges replicated."""
    h, w = shape
    out = list(values)
    for _ in range(passes):
        src = out
        out = [0.0] * (h * w)
        for r in range(h):
            rows = (max(r - 1, 0), r, min(r + 1, h - 1))
            for c in range(w):
                cols = (max(c - 1, 0), c, min(c + 1, w - 1))
                acc = 0.0
                for wr, rr in zip((1, 2, 1), rows, strict=False):
                    base = rr * w
                    acc += wr * (src[base + cols[0]] + 2 * src[base + cols[1]] + src[base + cols[2]])
                out[r * w + c] = acc / 16.0
    return out


def upsample(shape, values, scale):
    """Bilinear upsampling by an integer factor (pixel centres aligned)."""
    h, w = shape
    H, W = h * scale, w * scale
    out = [0.0] * (H * W)
    for R in range(H):
        y = min(max((R + 0.5) / scale - 0.5, 0.0), h - 1.0)
        y0 = int(y)
        y1 = min(y0 + 1, h - 1)
        fy = y - y0
        for C in range(W):
            x = min(max((C + 0.5) / scale - 0.5, 0.0), w - 1.0)
            x0 = int(x)
            x1 = min(x0 + 1, w - 1)
            fx = x - x0
            top = values[y0 * w + x0] * (1 - fx) + values[y0 * w + x1] * fx
            bot = values[y1 * w + x0] * (1 - fx) + values[y1 * w + x1] * fx
            out[R * W + C] = top * (1 - fy) + bot * fy
    return (H, W), out


# ---- PNG ----------------------------------------------------------------------------------------


def read_png_gray(path):
    """(width, height, luminance values 0..255) of an 8- or 16-bit, non-interlaced PNG."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(path + ": not a PNG")
    pos, idat, palette = 8, [], None
    while pos < len(raw):
        n = struct.unpack(">I", raw[pos : pos + 4])[0]
        kind = raw[pos + 4 : pos + 8]
        chunk = raw[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"PLTE":
            palette = chunk
        elif kind == b"IDAT":
            idat.append(chunk)
        pos += 12 + n
    if interlace:
        raise ValueError(path + ": interlaced PNG not supported")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    bpp = max(1, channels * depth // 8)
    stride = (width * channels * depth + 7) // 8
    data = zlib.decompress(b"".join(idat))
    rows, prev = [], bytearray(stride)
    for r in range(height):
        ftype = data[r * (stride + 1)]
        line = bytearray(data[r * (stride + 1) + 1 : (r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    gray = []
    for line in rows:
        if depth == 16:
            samples = line[0::2]  # the high byte of each big-endian sample
        elif depth == 8:
            samples = line
        else:
            raise ValueError(f"{path}: bit depth {depth} not supported")
        if ctype == 3:
            assert palette is not None, f"{path}: a palette image without a PLTE chunk"
            for i in samples[:width]:
                rr, gg, bb = palette[3 * i : 3 * i + 3]
                gray.append((299 * rr + 587 * gg + 114 * bb) // 1000)
        elif channels >= 3:
            for x in range(width):
                rr, gg, bb = samples[x * channels : x * channels + 3]
                gray.append((299 * rr + 587 * gg + 114 * bb) // 1000)
        else:
            gray.extend(samples[x * channels] for x in range(width))
    return width, height, gray


def write_png_gray(path, width, height, pixels):
    rows = b"".join(b"\0" + bytes(pixels[r * width : (r + 1) * width]) for r in range(height))

    def chunk(kind, body):
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    write_file(
        path,
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b""),
    )


def flowchart_png(path, steps, width=640, box_h=40, gap=24):
    """A box-and-arrow pipeline diagram (one box per step, top to bottom)."""
    height = len(steps) * (box_h + gap) + gap
    px = [255] * (width * height)

    def rect(x0, y0, x1, y1, v):
        for y in range(y0, y1):
            for x in range(x0, x1):
                px[y * width + x] = v

    for k, _ in enumerate(steps):
        top = gap + k * (box_h + gap)
        rect(80, top, width - 80, top + box_h, 40)
        rect(83, top + 3, width - 83, top + box_h - 3, 235)
        if k + 1 < len(steps):
            rect(width // 2 - 1, top + box_h, width // 2 + 2, top + box_h + gap, 40)
            for d in range(6):
                rect(
                    width // 2 - 6 + d,
                    top + box_h + gap - 6 + d,
                    width // 2 + 7 - d,
                    top + box_h + gap - 5 + d,
                    40,
                )
    write_png_gray(path, width, height, px)


def detect_blobs(width, height, gray, classes, min_area=12):
    """Dark blobs on a lighter background: threshold below the background, components, boxes."""
    ordered = sorted(gray)
    background = ordered[int(len(ordered) * 0.75)]
    thr = background - max(12, (background - ordered[int(len(ordered) * 0.05)]) * 0.35)
    mask = [1 if v < thr else 0 for v in gray]
    if sum(mask) > 0.6 * len(mask):  # bright objects on a dark background instead
        thr = ordered[int(len(ordered) * 0.25)] + 20
        mask = [1 if v > thr else 0 for v in gray]
    comps = components(mask, (width, height), min_size=min_area)
    areas = sorted(len(c) for c in comps)
    median = areas[len(areas) // 2] if areas else 0
    boxes = []
    for comp in comps[:100]:
        xs = [i % width for i in comp]
        ys = [i // width for i in comp]
        x1, y1, x2, y2 = min(xs), min(ys), max(xs) + 1, max(ys) + 1
        fill = len(comp) / float((x2 - x1) * (y2 - y1))
        cls = classes[0]
        if len(classes) >= 3 and median:
            if len(comp) >= 2.0 * median:
                cls = classes[1]
            elif len(comp) <= 0.3 * median:
                cls = classes[2]
        boxes.append(
            {
                "class": cls,
                "score": round(0.3 + 0.6 * min(fill, 1.0), 3),
                "x1": float(x1),
                "y1": float(y1),
                "x2": float(x2),
                "y2": float(y2),
            }
        )
    return boxes


# ---- VQA and reports ----------------------------------------------------------------------------

_ORGAN_WORDS = {
    "chest": "lung",
    "abdomen": "liver",
    "head": "brain",
    "brain": "brain",
    "pelvis": "bladder",
    "spine": "spine",
    "neck": "thyroid",
}


def vqa_prior(question):
    """An answer prior: the most common answer for the question's type, no image model."""
    qtype = str(question.get("question_type") or "").lower()
    options = question.get("options") or {}
    if options:
        # Among the options, the prior prefers a "no abnormality" option, else the first.
        for label in sorted(options):
            if "no acute" in options[label].lower() or "normal" in options[label].lower():
                return label, options[label]
        label = sorted(options)[0]
        return label, options[label]
    text = str(question.get("question") or "").lower()
    if qtype in ("binary", "closed", "yes/no") or text.split(" ")[0] in (
        "is",
        "are",
        "does",
        "do",
        "was",
        "can",
        "has",
    ):
        return "", "no"
    if "organ" in text or "where" in text:
        return "", _ORGAN_WORDS.get(str(question.get("body_system") or "").lower(), "lung")
    if "how many" in text:
        return "", "1"
    return "", _ORGAN_WORDS.get(str(question.get("body_system") or "").lower(), "normal")


_CXR_TEMPLATE = (
    "The heart size is normal. The mediastinal contours are within normal limits. The lungs are "
    "clear without focal consolidation. There is no pleural effusion or pneumothorax. The osseous "
    "structures are unremarkable."
)
_PATH_TEMPLATE = (
    "Histologic section of tissue showing glandular and stromal components with scattered "
    "inflammatory cells. No definite malignant features are identified in this field."
)


def report_template(manifest, style, section):
    views = int(manifest.get("image_count") or len(manifest.get("image_files") or []) or 1)
    if style == "pathology":
        return _PATH_TEMPLATE
    text = _CXR_TEMPLATE
    if views > 1:
        text = f"{views} views of the chest. " + text
    if section == "full":
        text = "FINDINGS: " + text + "\n\nIMPRESSION: No acute cardiopulmonary process."
    return text


# ---- configuration -----------------------------------------------------------------------------


def load_config(path="pipeline.json"):
    with open(path) as f:
        return json.load(f)


def case_ids(cfg):
    return sorted(d for d in os.listdir(cfg["data"]) if os.path.isdir(os.path.join(cfg["data"], d)))


def write_file(path, data):
    """Write ``data`` (bytes, text, or anything else as JSON) to ``path``, making its folder first."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if not isinstance(data, (bytes, str)):
        data = json.dumps(data, indent=1)
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def output_paths(cfg, case):
    return [os.path.join(cfg["root"], p.replace("{case}", case)) for p in cfg["outputs"]]
