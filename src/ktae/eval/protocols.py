"""The papers' evaluation protocols as presets, and per-benchmark sample counts.

``ktae eval --protocol ktae|taco`` sets the prompt template, decoding, response budget
and the number of samples k of each benchmark; every flag given explicitly overrides
the preset (``--template``, ``--temperature``, ``--top-p``, ``--max-new-tokens``,
``--k``).

* ``ktae``: the KTAE authors' released evaluation (``eval/run_eval.sh`` and
  ``eval_baseline.py`` of their repository): the ``qwen-math-system`` template (the
  Qwen-Math instruction as the system message of a ChatML prompt), greedy decoding,
  3,000 new tokens (what the released script ran: ``run_eval.sh`` sets ``max_tokens=8000``
  but never passes it on, so ``eval_baseline.py`` kept its default of 3,000 with a
  4,096-token context), one sample per problem, graded by their grader (``ktae-authors``,
  :mod:`ktae.eval.graders`).
* ``taco``: the TACO paper, Appendix A: temperature 0.7, top-p 0.9, 16,384 new tokens;
  avg@32 on AIME24, AIME25 and AMC23, avg@4 on MATH-500, Minerva and OlympiadBench,
  avg@16 on MMLU-Pro and GPQA-Diamond; the prompt it quotes ("Please reason step by step,
  and put your final answer within \\boxed{}") after the problem as the user message
  (``auto``: through the tokenizer's chat template when it has one, else ``qwen-math``);
  graded by normalised exact match or numerical equality (``taco``); AIME from the hub
  sets it cites, ``math-ai/aime24`` and ``math-ai/aime25`` (:attr:`Protocol.hub_sources`,
  used when the benchmarks come from the hub). The KTAE evaluation suite's splits (``--data-dir`` of
  its saved DatasetDict) are keyed by the names they are reported under: ``aime24``,
  ``amc22-23`` (AMC 2022 and 2023, avg@32 as AMC), ``math500``, ``minerva``,
  ``olympiadbench``. Benchmarks it does not list get one sample.

``--k`` takes one integer (every benchmark), or comma-separated ``name=k`` entries, with
at most one bare integer among them for the benchmarks not named
(``--k aime24=32,math500=4`` or ``--k 4,aime24=32``): :func:`parse_k`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Protocol:
    """One paper's evaluation settings (see the module docstring)."""

    name: str
    template: str
    temperature: float
    top_p: float
    max_new_tokens: int
    k: Mapping[str, int] = field(default_factory=dict)
    """Samples per benchmark; benchmarks not listed get :attr:`default_k`."""
    default_k: int = 1
    source: str = ""
    grader: str = "default"
    """The grader of :mod:`ktae.eval.graders` the paper's numbers were graded with."""
    hub_sources: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Benchmark -> (hub dataset, split) replacing ktae's default hub source."""

    def k_for(self, benchmark: str) -> int:
        return self.k.get(benchmark, self.default_k)

    def as_dict(self) -> dict:
        return {"name": self.name, "template": self.template, "temperature": self.temperature,
                "top_p": self.top_p, "max_new_tokens": self.max_new_tokens, "k": dict(self.k),
                "default_k": self.default_k, "source": self.source, "grader": self.grader,
                "hub_sources": {b: list(v) for b, v in self.hub_sources.items()}}


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("ktae", template="qwen-math-system", temperature=0.0, top_p=1.0,
             max_new_tokens=3000, k={}, default_k=1,
             source="the KTAE authors' eval/run_eval.sh and eval_baseline.py",
             grader="ktae-authors"),
    Protocol("taco", template="auto", temperature=0.7, top_p=0.9,
             max_new_tokens=16384,
             # amc22-23: the AMC split of the KTAE evaluation suite (AMC 2022 and 2023,
             # ktae.eval.benchmarks.SAVED_SPLIT_NAMES), sampled as the paper samples AMC
             k={"aime24": 32, "aime25": 32, "amc23": 32, "amc22-23": 32, "math500": 4,
                "minerva": 4, "olympiadbench": 4, "mmlu_pro": 16, "gpqa_diamond": 16},
             default_k=1, source="TACO paper, Appendix A", grader="taco",
             hub_sources={"aime24": ("math-ai/aime24", "test"),
                          "aime25": ("math-ai/aime25", "test")}),
)}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"--protocol: expected one of {tuple(PROTOCOLS)}, got {name!r}")
    return PROTOCOLS[name]


def _positive(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip().lstrip("+"):
        raise ValueError(f"{where}: expected a positive integer, got {text!r}")
    return value


def parse_k(spec: str) -> tuple[int | None, dict[str, int]]:
    """``"4"`` -> ``(4, {})``; ``"aime24=32,math500=4"`` -> ``(None, {...})``;
    ``"4,aime24=32"`` -> ``(4, {"aime24": 32})``. Errors name ``--k``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--k: expected a positive integer or name=k entries, got {spec!r}")
    default, per = None, {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            raise ValueError(f"--k: empty entry in {spec!r}")
        if "=" in part:
            name, _, value = (s.strip() for s in part.partition("="))
            if not name:
                raise ValueError(f"--k: expected name=k, got {part!r}")
            if name in per:
                raise ValueError(f"--k: {name} given twice")
            per[name] = _positive(value, f"--k {name}")
        else:
            if default is not None:
                raise ValueError(f"--k: at most one bare integer, got {spec!r}")
            default = _positive(part, "--k")
    return default, per


@dataclass(frozen=True)
class Settings:
    """What an evaluation generates with, and where each value came from (``"given"``,
    ``"protocol <name>"``, or None when left to the model's file / the defaults)."""

    template: str | None
    temperature: float | None
    top_p: float
    max_new_tokens: int | None
    k: dict[str, int]
    sources: dict[str, str | None]
    protocol: Protocol | None = None
    grader: str = "default"

    def describe(self) -> str:
        """One console line, e.g. ``decoding: temperature 0.7, top-p 0.9 (protocol taco);
        k aime24=32, math500=4 (protocol taco)``."""
        def src(field):
            return self.sources.get(field) or "default"

        if self.temperature is None:
            temp = "temperature 0 for k = 1, 0.6 for k > 1 (default)"
        elif self.temperature == 0:
            temp = f"greedy ({src('temperature')})"
        else:
            temp = f"temperature {self.temperature:g} ({src('temperature')})"
        top_p = f"top-p {self.top_p:g} ({src('top_p')})"
        ks = ", ".join(f"{b}={n}" for b, n in self.k.items())
        head = f"protocol {self.protocol.name} ({self.protocol.source})\n" \
            if self.protocol else ""
        return (f"{head}decoding: {temp}, {top_p}; k {ks} ({src('k')}); "
                f"grader {self.grader} ({src('grader')})")


def resolve_settings(benchmarks: Sequence[str], *, protocol: str | None = None,
                     template: str | None = None, temperature: float | None = None,
                     top_p: float | None = None, max_new_tokens: int | None = None,
                     k: str | int | None = None, grader: str | None = None) -> Settings:
    """Explicit values (not None) first, then the protocol's, then None (left to the
    model's ``ktae_generation.json`` and the defaults: top-p 1, k = 1).

    ``k``: an int, or a :func:`parse_k` string. Naming a benchmark that is not in
    ``benchmarks`` is an error.
    """
    proto = get_protocol(protocol) if protocol is not None else None
    label = f"protocol {proto.name}" if proto else None
    sources: dict[str, str | None] = {}

    def pick(name, given, preset):
        if given is not None:
            sources[name] = "given"
            return given
        if proto is not None:
            sources[name] = label
            return preset
        sources[name] = None
        return None

    t = pick("template", template, proto.template if proto else None)
    temp = pick("temperature", temperature, proto.temperature if proto else None)
    p = pick("top_p", top_p, proto.top_p if proto else None)
    n = pick("max_new_tokens", max_new_tokens, proto.max_new_tokens if proto else None)
    g = pick("grader", grader, proto.grader if proto else None) or "default"
    if isinstance(k, int) and not isinstance(k, bool):
        default, per = (_positive(str(k), "--k"), {})
    elif k is None:
        default, per = None, {}
    else:
        default, per = parse_k(k)
    unknown = [b for b in per if b not in benchmarks]
    if unknown:
        raise ValueError(f"--k: {', '.join(unknown)} not among the benchmarks "
                         f"({', '.join(benchmarks)})")
    ks, k_sources = {}, set()
    for b in benchmarks:
        if b in per or default is not None:
            ks[b], src = per.get(b, default), "given"
        elif proto is not None:
            ks[b], src = proto.k_for(b), label
        else:
            ks[b], src = 1, None
        k_sources.add(src)
    sources["k"] = " and ".join(sorted(s for s in k_sources if s)) or None
    return Settings(template=t, temperature=temp, top_p=1.0 if p is None else p,
                    max_new_tokens=n, k=ks, sources=sources, protocol=proto, grader=g)
