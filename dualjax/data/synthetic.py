"""Synthetic question-paraphrase clusters: the embedded default dataset.

Each cluster is one *intent* -- an (action, object, context) triple of concepts -- rendered
several times through different question templates, synonym choices, filler words and light
typos. Training clusters provide positive (question, paraphrase) pairs; the "val" and "test"
splits hold disjoint intents and are meant for retrieval: every question of a cluster of size
>= 2 is a query, the other members are relevant, the corpus is the whole split.

Word overlap alone is deliberately misleading:
  * paraphrases use different surface forms of the same concept (car / automobile / vehicle),
    different templates and fillers, so true positives often share few words;
  * every eval split carries *distractors* (singleton clusters, never queries) that copy one
    member's template, fillers and surface words but swap the action or object concept;
  * intents are drawn in *families* that share a context and an action or object, so
    neighbouring clusters of the same split overlap lexically.
The lexicon is shared by all splits, so a model trained on the training pairs can learn the
synonym structure and generalise to unseen clusters.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping
from typing import Any

from dualjax.data import clusters, sources
from dualjax.text.words import normalize


def _groups(spec: str) -> tuple[tuple[str, ...], ...]:
    """"a/b/c; d/e" -> (("a", "b", "c"), ("d", "e")): concept groups of surface forms."""
    return tuple(tuple(f.strip() for f in g.split("/")) for g in spec.split(";") if g.strip())


ACTIONS = _groups("""
    fix/repair/mend/sort out; clean/wash/scrub/cleanse; buy/purchase/acquire/pick up;
    sell/resell/offload/trade in; paint/repaint/colour/apply paint to;
    store/stow/put away/keep safe;
    move/relocate/transport/shift; build/construct/assemble/put together;
    install/set up/mount/fit;
    remove/take off/detach/pull off; choose/pick/select/decide on;
    maintain/look after/care for/service;
    insure/get insurance for/get coverage for; rent/hire/lease/borrow;
    decorate/style/adorn/dress up;
    protect/shield/safeguard/guard; measure/size up/gauge/take measurements of;
    throw away/discard/dispose of/get rid of; upgrade/improve/enhance/modernize;
    inspect/check/examine/look over; heat/warm up/heat up; cool/chill/cool down;
    polish/shine/buff; disinfect/sanitize/sterilize; organize/arrange/tidy/tidy up;
    replace/swap out/substitute/exchange; draw/sketch/illustrate; photograph/take pictures of/snap;
    unlock/open up/unseal; lubricate/oil/grease; wrap/package/pack up; label/tag/mark;
    donate/give away/gift; find/locate/track down; hide/conceal/cover up; test/try out/trial
""")
OBJECTS = _groups("""
    car/automobile/vehicle/motorcar; bike/bicycle/cycle/push bike; sofa/couch/settee;
    laptop/notebook computer/portable computer; phone/mobile/cellphone/smartphone;
    fridge/refrigerator/icebox; oven/stove/cooker; shoes/sneakers/footwear/trainers;
    jacket/coat/parka; dining table/kitchen table/table; bed/bedframe/bedstead;
    window/windowpane/glass pane; door/front door/entrance door; roof/rooftop/roofing;
    garden/yard/backyard; fence/railing/paling; floor/flooring/floorboards; carpet/rug/mat;
    lamp/light fixture/reading light; sink/basin/washbasin; toilet/loo/lavatory;
    bathtub/bath/tub; kettle/electric kettle/water boiler; printer/inkjet/printing machine;
    television/tv/telly; camera/digital camera/dslr; guitar/acoustic guitar/six-string;
    piano/upright piano/keyboard; watch/wristwatch/timepiece; backpack/rucksack/knapsack;
    tent/camping tent/bivouac; boat/dinghy/rowboat; lawnmower/mower/grass cutter;
    chair/armchair/seat; curtains/drapes/window blinds; mirror/looking glass/vanity mirror;
    bookshelf/bookcase/shelving unit; aquarium/fish tank/fishbowl; suitcase/luggage/travel case;
    headphones/earphones/headset
""")
CONTEXTS = _groups("""
    on a budget/without spending much/cheaply/for little money; at home/in my house/indoors;
    quickly/fast/in a hurry/in no time; without tools/with no tools/lacking any equipment;
    as a beginner/for the first time/as a newbie/with no experience;
    in winter/during the cold season/when it is freezing; safely/without risk/without getting hurt;
    by myself/alone/without help/on my own; in the rain/in wet weather/when it is raining;
    at night/after dark/in the evening; in a small apartment/in a tiny flat/with limited space;
    for my kids/for my children/with the little ones around; while travelling/on the road/on a trip;
    properly/correctly/the right way; without making a mess/cleanly/neatly;
    in summer/during the hot months/when it is hot; for the long term/for years/permanently;
    as a student/while at college/at university; sustainably/in an eco-friendly way/in a green way;
    at the office/at work/in the workplace
""")
TEMPLATES = (
    "how do i {a} my {o} {c}?",
    "what is the best way to {a} the {o} {c}?",
    "{a} {o} {c}: any tips?",
    "any advice on how to {a} the {o} {c}?",
    "{c}, how can i {a} my {o}?",
    "is there a good method to {a} my {o} {c}?",
    "what should i do to {a} the {o} {c}",
    "i need to {a} my {o} {c}. how?",
    "ways to {a} your {o} {c}",
    "{c}, what's the easiest way to {a} my {o}",
    "can you explain how one would {a} the {o} {c}",
    "steps to {a} my {o} {c}?",
    "how should i go about trying to {a} my {o} {c}",
    "looking for help: {a} {o} {c}",
    "is it possible to {a} a {o} {c}?",
    "what's the trick to {a} my {o} {c}",
)
PREFIXES = ("", "", "", "", "please,", "hey,", "quick question:", "can someone tell me",
            "actually,", "i was wondering,", "honestly,")
SUFFIXES = ("", "", "", "", "please", "thanks", "in general", "really", "any ideas?",
            "thank you!", "asap")
KEEP_PROB = 0.5  # chance a paraphrase keeps the cluster's template / a slot's surface form


@dataclasses.dataclass(frozen=True)
class Question:
    text: str
    cluster: int  # unique across the dataset; distractors are clusters of size 1


@dataclasses.dataclass(frozen=True)
class SyntheticData:
    train_pairs: list[tuple[str, str]]  # positive (question, paraphrase) pairs, train clusters
    splits: dict[str, list[Question]]  # "val" / "test": eval clusters + distractors


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Every choice that went into one rendered question (so distractors can copy it)."""
    intent: tuple[int, int, int]  # (action, object, context) concept ids
    forms: tuple[int, int, int]  # surface form index within each concept group
    template: int
    prefix: str
    suffix: str


_SLOTS = (ACTIONS, OBJECTS, CONTEXTS)


def _triple(values: Iterable[int]) -> tuple[int, int, int]:
    """tuple(values) for the three slots (action, object, context)."""
    a, o, c = values
    return a, o, c


def _render(spec: _Spec) -> str:
    a, o, c = (slot[i][f % len(slot[i])]
               for slot, i, f in zip(_SLOTS, spec.intent, spec.forms, strict=True))
    text = TEMPLATES[spec.template].format(a=a, o=o, c=c)
    return " ".join(p for p in (spec.prefix, text, spec.suffix) if p)


def _typo(text: str, rng: random.Random) -> str:
    """Swap two adjacent letters of, or drop one letter from, one word of >= 4 letters."""
    words = text.split(" ")
    idx = [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 4]
    if not idx:
        return text
    i = rng.choice(idx)
    w = words[i]
    j = rng.randrange(1, len(w) - 1)
    words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:] if rng.random() < 0.5 else w[:j] + w[j + 1:]
    return " ".join(words)


class _Generator:
    def __init__(self, seed: int, cluster_size: tuple[int, int], typo_prob: float):
        self.rng = random.Random(seed)
        self.lo, self.hi = cluster_size
        if not 2 <= self.lo <= self.hi:
            raise ValueError(f"cluster_size must satisfy 2 <= lo <= hi, got {cluster_size}")
        self.typo_prob = typo_prob
        self.used_intents: set[tuple[int, int, int]] = set()
        self.seen: set[str] = set()  # normalised texts, globally unique
        self.next_id = 0

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _random_intent(self) -> tuple[int, int, int]:
        return _triple(self.rng.randrange(len(slot)) for slot in _SLOTS)

    def _vary(self, intent: tuple[int, int, int], slot: int) -> tuple[int, int, int] | None:
        """A fresh intent equal to `intent` except for a different concept in `slot`."""
        for _ in range(30):
            concepts = list(intent)
            concepts[slot] = self.rng.randrange(len(_SLOTS[slot]))
            new = _triple(concepts)
            if new != intent and new not in self.used_intents:
                return new
        return None

    def _accept(self, spec: _Spec, typo: bool) -> str | None:
        text = _render(spec)
        if typo and self.rng.random() < self.typo_prob:
            text = _typo(text, self.rng)
        key = normalize(text)
        if not key or key in self.seen:
            return None
        self.seen.add(key)
        return text

    def _intents(self, n: int) -> list[tuple[int, int, int]]:
        """n fresh intents in families sharing the context and the action or the object."""
        out: list[tuple[int, int, int]] = []
        while len(out) < n:
            base = self._random_intent()
            if base in self.used_intents:
                continue
            family = [base]
            self.used_intents.add(base)
            for _ in range(self.rng.randint(0, 2)):
                new = self._vary(base, self.rng.choice((0, 1)))
                if new is not None:
                    family.append(new)
                    self.used_intents.add(new)
            out.extend(family)
        for extra in out[n:]:  # give back what did not fit
            self.used_intents.discard(extra)
        return out[:n]

    def _pick(self, keep: int, n: int) -> int:
        """`keep` with probability KEEP_PROB, otherwise uniform over range(n)."""
        return keep if self.rng.random() < KEEP_PROB else self.rng.randrange(n)

    def _cluster(self, intent: tuple[int, int, int]) -> list[tuple[_Spec, str]]:
        """Paraphrases: each member re-draws the template and each surface form of a canonical
        rendering with probability 1 - KEEP_PROB, and draws its own fillers and typo."""
        size = self.rng.randint(self.lo, self.hi)
        groups = [slot[i] for slot, i in zip(_SLOTS, intent, strict=True)]
        template = self.rng.randrange(len(TEMPLATES))
        forms = [self.rng.randrange(len(g)) for g in groups]
        members: list[tuple[_Spec, str]] = []
        for _ in range(size * 20):
            if len(members) == size:
                break
            spec = _Spec(
                intent=intent,
                forms=_triple(self._pick(f, len(g)) for f, g in zip(forms, groups, strict=True)),
                template=self._pick(template, len(TEMPLATES)),
                prefix=self.rng.choice(PREFIXES),
                suffix=self.rng.choice(SUFFIXES),
            )
            text = self._accept(spec, typo=True)
            if text is not None:
                members.append((spec, text))
        return members

    def _distractor(self, spec: _Spec) -> str | None:
        """Same template, fillers and surface words for two slots; another action/object."""
        slot = self.rng.choice((0, 1))
        new = self._vary(spec.intent, slot)
        if new is None:
            return None
        forms = list(spec.forms)
        forms[slot] = self.rng.randrange(len(_SLOTS[slot][new[slot]]))
        text = self._accept(dataclasses.replace(spec, intent=new, forms=_triple(forms)), typo=False)
        if text is not None:
            self.used_intents.add(new)
        return text

    def train_pairs(self, n: int) -> list[tuple[str, str]]:
        pairs = []
        for intent in self._intents(n):
            texts = [t for _, t in self._cluster(intent)]
            pairs += [(texts[i], texts[j])
                      for i in range(len(texts)) for j in range(i + 1, len(texts))]
            self._new_id()
        self.rng.shuffle(pairs)
        return pairs

    def eval_split(self, n: int, distractors_per_cluster: float) -> list[Question]:
        questions: list[Question] = []
        clusters = []
        for intent in self._intents(n):
            cid, members = self._new_id(), self._cluster(intent)
            clusters.append(members)
            questions += [Question(t, cid) for _, t in members]
        num_distractors = round(distractors_per_cluster * n)
        order = self.rng.sample(range(n), n) if n else []
        for d in range(num_distractors):
            members = clusters[order[d % n]]
            for _ in range(10):
                text = self._distractor(self.rng.choice(members)[0])
                if text is not None:
                    questions.append(Question(text, self._new_id()))
                    break
        self.rng.shuffle(questions)
        return questions


def generate(seed: int = 0, num_train_clusters: int = 3000, num_val_clusters: int = 200,
             num_test_clusters: int = 500, cluster_size: tuple[int, int] = (2, 5),
             distractors_per_cluster: float = 1.0, typo_prob: float = 0.05) -> SyntheticData:
    """Generate the dataset; identical arguments give identical output.

    Cluster ids: training clusters first, then val, then test (clusters and distractors).
    `cluster_size` is an inclusive range. Intents and normalised question texts are unique
    across the whole dataset, so the splits are disjoint.
    """
    g = _Generator(seed, cluster_size, typo_prob)
    train = g.train_pairs(num_train_clusters)
    val = g.eval_split(num_val_clusters, distractors_per_cluster)
    test = g.eval_split(num_test_clusters, distractors_per_cluster)
    return SyntheticData(train_pairs=train, splits={"val": val, "test": test})


# ----------------------------------------------------------------------------- the source
def _settings(data: Mapping[str, Any], seed: int) -> dict:
    return {**sources.clustered_settings(data, seed),
            "num_train_clusters": data["num_train_clusters"],
            "num_val_clusters": data["num_val_clusters"],
            "num_test_clusters": data["num_test_clusters"]}


def _load(settings: dict) -> clusters.RawData:
    """The embedded default: seeded question-paraphrase clusters, split by cluster."""
    data = generate(
        seed=settings["seed"], num_train_clusters=settings["num_train_clusters"],
        num_val_clusters=settings["num_val_clusters"],
        num_test_clusters=settings["num_test_clusters"])
    offset = 1 + max(q.cluster for qs in data.splits.values() for q in qs)
    train_cluster = clusters.cluster_pairs(data.train_pairs)
    items = [(t, offset + c, "train") for t, c in train_cluster.items()]
    items += [(q.text, q.cluster, s) for s in clusters.EVAL_SPLITS for q in data.splits[s]]
    return clusters.cluster_raw(data.train_pairs, items, settings)


sources.register(sources.Source("synthetic_paraphrase", _load, _settings, reads_path=False))
