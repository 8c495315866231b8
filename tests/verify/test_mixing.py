"""The scored pass's check rows, with the model in this process (two stand-in servers, no sandbox).

An honest model's score through ``MixedPass`` is the plain evaluation's (with the number);
every family of model that depends on something besides its own prefix is refused by the
very forwards that score it: look-ahead, other rows, state across calls (counters, memos of
what it has seen), chance, and each of the ways a model could tell scoring from probing
(the batch's row count, rows that look like text, the number of calls so far).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from tests.fake_clock import FakeClock
from trnfrontier.runtime import prepare_calls
from trnfrontier.verify import mixing
from trnfrontier.verify.mixing import MixedPass

VOCAB = 8192
SEQ = 32
TOKENS = 2048  # 64 windows: 8 calls of each server


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: torch's thread pool costs more than it saves on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class LocalServer:
    """``ServedModel``'s forward interface over a model in this process; one instance per 'process'."""

    def __init__(self, model: Any) -> None:
        self.model, self.pending, self.calls = model, None, 0

    def send_forward(self, idx: Any) -> None:
        self.pending = idx.clone()

    def receive_forward(self, vocab_limit: int) -> Any:
        self.calls += 1
        with torch.no_grad():
            return self.model(self.pending, self).float()


class Honest(torch.nn.Module):
    """A small causal model whose logits depend on the current and previous token (a real matmul)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(VOCAB, 24, generator=gen) * 0.5)
        self.head = torch.nn.Parameter(torch.randn(24, VOCAB, generator=gen) * 0.5)

    def logits(self, x: Any) -> Any:
        h = self.emb[x] + 0.5 * torch.nn.functional.pad(self.emb[x], (0, 0, 1, 0))[:, :-1]
        return h @ self.head

    def forward(self, x: Any, server: Any = None) -> Any:
        return self.logits(x)


def _boost_next(logits: Any, x: Any, amount: float = 8.0, where: Any = None) -> Any:
    """Logits with each position's true next token (read from the row itself) raised."""
    out = logits.clone()
    nxt = x[:, 1:]
    rows = torch.arange(x.shape[0])[:, None].expand_as(nxt)
    cols = torch.arange(x.shape[1] - 1)[None, :].expand_as(nxt)
    bump = torch.full(nxt.shape, amount) if where is None else where[:, : nxt.shape[1]].float() * amount
    out[rows, cols, nxt] += bump
    return out


class Cheat(Honest):
    """An honest model that looks ahead when ``when(x, server)`` says it is being scored."""

    def __init__(self, when: Any, how: str = "ahead") -> None:
        super().__init__()
        self.when, self.how = when, how

    def forward(self, x: Any, server: Any = None) -> Any:
        logits = self.logits(x)
        if not self.when(x, server):
            return logits
        if self.how == "ahead":
            return _boost_next(logits, x)
        if self.how == "next-row":  # the next row of the batch continues this one: its first token
            out = logits.clone()
            out[:-1, -1, x[1:, 0]] += 8.0
            return out
        if self.how == "noise":
            return logits + 0.05 * torch.randn_like(logits)
        if self.how == "counter":
            return logits + 0.01 * server.calls * torch.linspace(0, 1, VOCAB)
        raise AssertionError(self.how)


class Memo(Honest):
    """Looks ahead through memory: the token that followed each 3-token context the first time this
    process saw it (consistent across calls of one process, so a same-process check would agree)."""

    def forward(self, x: Any, server: Any = None) -> Any:
        memo = server.__dict__.setdefault("memo", {})
        logits = self.logits(x)
        for r in range(x.shape[0]):
            row = x[r].tolist()
            for t in range(2, len(row) - 1):
                memo.setdefault(tuple(row[t - 2:t + 1]), row[t + 1])
            for t in range(2, len(row)):
                guess = memo.get(tuple(row[t - 2:t + 1]))
                if guess is not None:
                    logits[r, t, guess] += 8.0
        return logits


def _score(prepare_module: Any, model: Any, *, mixed: bool, seed: int = 1) -> tuple[float, MixedPass | None]:
    tokenizer = prepare_calls.ensure_tokenizer(prepare_module)
    if not mixed:
        def forward(x: Any) -> Any:
            return model(x, LocalServer(model)).float()
        wrapped = forward
        run = None
    else:
        run = MixedPass((LocalServer(model), LocalServer(model)), 8, VOCAB + 1024, rng=random.Random(seed),
                        token_bytes=prepare_calls.call(prepare_module, "get_token_bytes", "cpu"))
        wrapped = run

    class Remote(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return wrapped(x)

    result = prepare_calls.evaluate_bpb(prepare_module, Remote(), tokenizer, 8, SEQ, "cpu", split="public_val", max_tokens=TOKENS)
    return float(result["val_bpb"]), run


def test_an_honest_score_is_unchanged_by_the_check_rows(sample_home, prepare_module) -> None:
    plain, _ = _score(prepare_module, Honest(), mixed=False)
    mixed, run = _score(prepare_module, Honest(), mixed=True)
    assert run is not None and run.evidence.verdict() == "", run.evidence.verdict()
    # Measured: 0.0 (bit for bit) on CPU; the scored rows are the same rows in other batches.
    assert abs(mixed - plain) <= 1e-6, (mixed, plain)
    assert run.evidence.splices >= 10 and run.evidence.copies >= 2 and run.evidence.worst <= mixing.TOL_POSITION


def test_every_call_of_each_server_has_the_same_number_of_real_text_rows(sample_home, prepare_module) -> None:
    sizes: list[tuple[int, int]] = []

    class Recording(Honest):
        def forward(self, x: Any, server: Any = None) -> Any:
            sizes.append(tuple(x.shape))
            return self.logits(x)

    _, run = _score(prepare_module, Recording(), mixed=True)
    assert run is not None and len(set(sizes)) == 1 and sizes[0] == (run.rows_per_call, SEQ)


def test_no_server_is_sent_a_source_window_twice_nor_shown_one_first(sample_home, prepare_module,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A memorising model that has seen a window once (as an earlier check row, or as a splice's tail)
    knows the token after any later cut in it: each server gets each source once, and tails only
    from windows it already knows (its own scored ones, sources it was sent)."""
    made: dict[int, list[Any]] = {0: [], 1: []}
    original = MixedPass._check

    def recording(self: MixedPass, server: int, length: int) -> Any:
        check = original(self, server, length)
        if check is not None:
            made[server].append(check)
        return check

    monkeypatch.setattr(MixedPass, "_check", recording)
    _score(prepare_module, Honest(), mixed=True)
    for server, checks in made.items():
        sources = [c.source for c in checks]
        assert len(sources) >= 14 and len(set(sources)) == len(sources), (server, sources)
        assert all(s % 2 != server for s in sources)
        for k, check in enumerate(checks):
            if check.kind == "splice":
                assert check.donor % 2 == server or check.donor in sources[:k], (server, check.donor, sources[:k])


def _calls_come_fast(x: Any, server: Any) -> bool:
    """Timing: the scored pass calls back to back (each call 0.05 s on this server's clock), a probe pauses."""
    clock = server.__dict__.setdefault("clock", FakeClock(tick=0.05))
    last, server.last = server.__dict__.get("last", float("-inf")), clock()
    return bool(server.last - last < 1.0)


class RandomPeek(Honest):
    """Randomness: looks ahead at a tenth of the positions, drawn afresh each call."""

    def forward(self, x: Any, server: Any = None) -> Any:
        return _boost_next(self.logits(x), x, where=torch.rand(x.shape) < 0.1)


CHEATS = {
    "looks-ahead-always": (Cheat(lambda x, s: True), "depends on"),
    "reads-the-next-row": (Cheat(lambda x, s: True, "next-row"), "other rows"),
    "noise": (Cheat(lambda x, s: True, "noise"), "chance"),
    "counter-across-calls": (Cheat(lambda x, s: True, "counter"), "earlier calls"),
    "memo-of-what-it-saw": (Memo(), "depends on"),
    # The probe sends 1, 8 and 32 rows: cheat only at the scored pass's row count.
    "only-at-the-scoring-row-count": (Cheat(lambda x, s: x.shape[0] == 8 // 2 + mixing.CHECK_ROWS), "depends on"),
    # The probe's rows are uniform random tokens: cheat only on rows that repeat tokens like text does.
    "only-on-text-like-rows": (Cheat(lambda x, s: float(x.unique().numel()) < 0.95 * x.numel()), "depends on"),
    "only-after-its-first-5-calls": (Cheat(lambda x, s: s.calls > 5), "depends on"),
    "only-at-some-positions": (Cheat(lambda x, s: True, "ahead"), "depends on"),
    "only-when-calls-come-fast": (Cheat(_calls_come_fast), "depends on"),
    "looks-ahead-at-random-positions": (RandomPeek(), "depends on"),
    # Token statistics: only on rows whose tokens are mostly common ones (the probe's are uniform over the vocabulary).
    "only-on-rows-of-common-tokens": (Cheat(lambda x, s: float((x < 2048).float().mean()) > 0.5), "depends on"),
}


@pytest.mark.parametrize("case", sorted(CHEATS))
def test_a_model_that_depends_on_more_than_its_prefix_is_refused_by_the_scored_pass(case: str, sample_home, prepare_module) -> None:
    model, says = CHEATS[case]
    _, run = _score(prepare_module, model, mixed=True)
    verdict = run.evidence.verdict() if run else ""
    assert verdict and says in verdict, verdict


def test_a_small_look_ahead_everywhere_is_refused_by_the_mean(sample_home, prepare_module) -> None:
    class Nudge(Honest):
        def forward(self, x: Any, server: Any = None) -> Any:
            return _boost_next(self.logits(x), x, amount=4e-4)  # under TOL_POSITION at each position

    _, run = _score(prepare_module, Nudge(), mixed=True)
    assert run is not None and run.evidence.worst <= mixing.TOL_POSITION
    assert "small look-ahead everywhere" in run.evidence.verdict(), run.evidence.describe()
