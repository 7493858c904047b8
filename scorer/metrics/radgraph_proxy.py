"""A lexicon-based RadGraph substitute and the F1RadGraph "partial" reward over its graphs, used when
the RadGraph model's weights are absent (the grader reports the substitution in ``degraded``).

Entities and relations follow RadGraph's schema (docs/vqa-and-report.md): anatomy ``ANAT-DP``;
observations ``OBS-DP``, ``OBS-DA`` (a negation cue in the clause) or ``OBS-U`` (a hedge cue);
modifiers take their head's category; ``modify`` links a modifier to the entity right after it
(within two tokens), ``located_at`` an observation to the nearest anatomy in its clause. The reward
is the F1 of the two graphs' items, ``(text, label, relation, target text)`` per relation an entity
starts, else ``(text, label)``. Both graphs empty → 1; exactly one empty → 0.
"""

from __future__ import annotations

import re

import msgspec

from scorer.metrics.negation import certainty, clauses


def _lexicon(text: str) -> list[str]:
    """The comma-separated entries of a lexicon block, in order (an entry may wrap a line)."""
    return [" ".join(w.split()) for w in text.split(",") if w.strip()]


_ANATOMY = _lexicon(
    """
    cardiomediastinal silhouette, cardiac silhouette, mediastinal contours, hilar contours,
    costophrenic angles, costophrenic angle, osseous structures, soft tissues, pulmonary
    vasculature, hemidiaphragms, hemidiaphragm, hemithorax, mediastinum, mediastinal,
    cardiomediastinal, heart, cardiac, lungs, lung, lobes, lobe, bases, base, apices, apex, hila,
    hilar, hilum, pleural, pleura, diaphragm, aorta, aortic, trachea, spine, ribs, rib, clavicle,
    chest, thorax, thoracic, vasculature, bones, bony, lingula, retrocardiac, perihilar, parenchyma,
    airspace, interstitium, stomach, abdomen, tissue, epithelium, stroma, gland, glands, mucosa,
    nuclei, cells, lymph node, lymph nodes
    """
)
_OBSERVATION = _lexicon(
    """
    pleural effusion, pleural effusions, effusion, effusions, pneumothorax, consolidation,
    consolidations, opacity, opacities, opacification, edema, congestion, atelectasis, cardiomegaly,
    enlargement, enlarged, pneumonia, nodule, nodules, mass, masses, fracture, fractures, granuloma,
    granulomas, emphysema, hyperinflation, infiltrate, infiltrates, scarring, thickening,
    calcification, calcifications, calcified, tortuous, tortuosity, degenerative changes, tube,
    line, catheter, pacemaker, wires, clips, normal, clear, unremarkable, stable, widened,
    carcinoma, adenocarcinoma, necrosis, inflammation, fibrosis, hyperplasia, dysplasia, metastasis,
    tumor, lesion, lesions, infarct, hemorrhage, ulcer, inflammatory, malignant, benign, atypia,
    mitoses
    """
)
_MODIFIERS = _lexicon(
    """
    left, right, bilateral, upper, lower, middle, small, large, moderate, mild, mildly, severe,
    trace, minimal, focal, diffuse, multifocal, patchy, basilar, apical, retrocardiac, new,
    increased, decreased, chronic, acute, well-differentiated, poorly, moderately, invasive
    """
)


# One alternation over every lexicon entry, longest first, so "pleural effusion" wins over "pleural"
# at the same position; a word in two lexicons keeps the first kind assigned here.
_KIND: dict[str, str] = {}
for _kind, _words in (("obs", _OBSERVATION), ("anat", _ANATOMY), ("mod", _MODIFIERS)):
    for _w in _words:
        _KIND.setdefault(_w, _kind)
_ENTITY = re.compile(r"\b(?:" + "|".join(re.escape(w) for w in sorted(_KIND, key=len, reverse=True)) + r")\b")


class Entity(msgspec.Struct, frozen=True):
    text: str
    label: str
    start: int
    end: int


class Graph(msgspec.Struct, frozen=True):
    entities: list[Entity]
    relations: list[tuple[int, str, int]]
    """(source entity index, relation, target entity index)."""


def extract_graph(text: str) -> Graph:
    """The substitute RadGraph of one report (see the module docstring)."""
    entities: list[Entity] = []
    relations: list[tuple[int, str, int]] = []
    for clause in clauses(text):
        first = len(entities)
        kinds: list[str] = []
        for m in _ENTITY.finditer(clause):
            kind = _KIND[m.group(0)]
            if kind == "anat":
                label = "ANAT-DP"
            else:
                c = certainty(clause, m.start(), m.end())
                label = {"present": "OBS-DP", "absent": "OBS-DA", "uncertain": "OBS-U"}[c]
            entities.append(Entity(m.group(0), label, m.start(), m.end()))
            kinds.append(kind)
        here = range(first, len(entities))
        for k, i in enumerate(here):
            if kinds[k] == "mod":
                nxt = i + 1
                if nxt < len(entities) and len(clause[entities[i].end : entities[nxt].start].split()) <= 2:
                    # A modifier takes its head's label (an anatomy head's is ANAT-DP).
                    entities[i] = msgspec.structs.replace(entities[i], label=entities[nxt].label)
                    relations.append((i, "modify", nxt))
            elif kinds[k] == "obs":
                anat = [j for j, kind in zip(here, kinds, strict=False) if kind == "anat"]
                if anat:
                    target = min(anat, key=lambda j: abs(entities[j].start - entities[i].start))
                    relations.append((i, "located_at", target))
    return Graph(entities, relations)


def partial_items(graph: Graph) -> set[tuple[str, ...]]:
    """RadGraph's ``partial`` reward items of one graph."""
    ents = graph.entities
    items: set[tuple[str, ...]] = {
        (ents[s].text, ents[s].label, rel, ents[d].text) for s, rel, d in graph.relations
    }
    starts = {s for s, _, _ in graph.relations}
    return items | {(e.text, e.label) for i, e in enumerate(ents) if i not in starts}


def partial_reward(hyp: Graph, ref: Graph) -> float:
    """F1 of the two graphs' partial items (both empty → 1, one empty → 0)."""
    h, r = partial_items(hyp), partial_items(ref)
    if not h and not r:
        return 1.0
    if not h or not r:
        return 0.0
    overlap = len(h & r)
    if overlap == 0:
        return 0.0
    p, rec = overlap / len(h), overlap / len(r)
    return 2 * p * rec / (p + rec)
