"""The scored pass, checked from inside: check rows mixed into the very forwards that produce the score.

A model can tell a separate probe from the scoring (the probe's rows are random tokens,
its batch sizes differ, it comes first) and keep the contract only there. So the rerun of
``evaluate_bpb`` itself carries the evidence. The trusted scorer calls the model with a
batch of consecutive validation windows; ``MixedPass`` answers each call with two model
servers, both started the same way, each in its own sandbox (its own writable tmpfs, PID,
network and IPC namespaces, no view of the cgroups; what both see is the same read-only files):

- the scored windows alternate between the servers (window ``w`` to server ``w % 2``), so
  neither server ever sees two adjacent windows, and neither sees what the other saw;
- each server call carries ``CHECK_ROWS`` check rows besides its scored rows, at random
  places in the batch, and is padded with more check rows when the scorer's last batch is
  short: every call of every server has the same number of rows of real validation text;
- a check row is built from a window the *other* server scores: a splice (the window's
  tokens up to a random cut, then real validation text from another window, from a random
  offset) or a copy (the window itself, in another batch of another process); each server
  is sent each source window at most once in a pass (while unsent ones remain), so no
  earlier check row has shown it the token after a later one's cut;
- every placement, cut and source is drawn from a 256-bit secret seed of the operating
  system's (``secrets``), printed nowhere: a model that sees every batch cannot recover
  it and so cannot tell which rows are checks, nor where a splice's cut is;
- from the check row's logits and the scored window's, the log-probability each gives the
  scored window's own next token is compared at every position they share (a splice: before
  the cut; a copy: all of them, the last one against the next window's first token).

A causal, batch-independent, stateless model gives the same log-probabilities up to float
noise. A model that reads later tokens differs at a splice's last shared position (it read
the window's real next token there, and other text in the check row); one that reads other
rows of its batch, keeps state across calls or draws random numbers differs on copies. The
server that answers a check row never saw the window it comes from, so no memory of earlier
calls lets it give the answer the scored window got. Only logits cross the pipe; every
comparison is made here, in verify's process.

Tolerances are on log-probabilities (nats), so no output scale can widen them:
``TOL_POSITION`` per compared position, and ``TOL_MEAN`` on the mean signed difference at
the splice points and over the copies (a small, systematic look-ahead everywhere). Both
are stated with the honest float noise they sit above in ``docs/ci.md``.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, field
from typing import Any

from trnfrontier.untrusted.served import ServedModel

CHECK_ROWS = 2
SPLICE_SHARE = 0.75  # of check rows; the rest are copies
# Per compared position: the honest models measured differ by at most ~1e-5 nats between
# batch compositions (docs/ci.md); a look-ahead moves the next token's log-probability by nats.
TOL_POSITION = 1e-3
# On the mean signed difference at splice points and over copies: a look-ahead that gains
# less than this everywhere changes val_bpb by under 4e-5, inside the rerun's 1e-4.
TOL_MEAN = 1e-4
MIN_FOR_MEAN = 16


@dataclass
class _Check:
    """One check row: from window ``source``; positions [0, ``shared``) are compared."""

    kind: str  # "splice" | "copy"
    source: int
    shared: int
    tokens: Any  # the row sent
    donor: int = -1


@dataclass
class Evidence:
    """What the comparisons found; ``problem`` is the first failure in words, or ''."""

    splices: int = 0
    copies: int = 0
    positions: int = 0
    worst: float = 0.0
    worst_where: str = ""
    splice_sum: float = 0.0
    copy_sum: float = 0.0
    copy_positions: int = 0
    problem: str = ""

    def splice_mean(self) -> float:
        return self.splice_sum / self.splices if self.splices else 0.0

    def copy_mean(self) -> float:
        return self.copy_sum / self.copy_positions if self.copy_positions else 0.0

    def verdict(self) -> str:
        """Why the scored pass's evidence refuses the model, or '' when it holds."""
        if self.problem:
            return self.problem
        if self.worst > TOL_POSITION:
            return self.worst_where
        if self.splices >= MIN_FOR_MEAN and abs(self.splice_mean()) > TOL_MEAN:
            return (f"over {self.splices} splices the scored windows give their next token {self.splice_mean():+.2g} nats more "
                    f"than copies that continue with other text (tolerance {TOL_MEAN:g}): a small look-ahead everywhere")
        if self.copy_positions >= MIN_FOR_MEAN and abs(self.copy_mean()) > TOL_MEAN:
            return (f"over {self.copies} copies the scored windows differ from their copies by {self.copy_mean():+.2g} nats a "
                    f"position on average (tolerance {TOL_MEAN:g})")
        return ""

    def describe(self) -> str:
        return (f"{self.splices} splice and {self.copies} copy check rows inside the scored pass, {self.positions:,} positions "
                f"compared: max |d log p| {self.worst:.2g} nats (tol {TOL_POSITION:g}), mean at splice points "
                f"{self.splice_mean():+.1g}, over copies {self.copy_mean():+.1g} (tol {TOL_MEAN:g})")


@dataclass
class MixedPass:
    """The model the trusted scorer is handed: each call answered by two servers with check rows mixed in."""

    servers: tuple[ServedModel, ServedModel]
    batch_size: int
    vocab_limit: int
    # Bytes of each token (the trusted get_token_bytes): targets of 0 bytes (the specials) never
    # count toward the score, so they are not compared either. None: every position is.
    token_bytes: Any = None
    evidence: Evidence = field(default_factory=Evidence)
    windows: list[Any] = field(default_factory=list)  # every scored window's tokens (int64 [T]), in order
    _signatures: dict[int, Any] = field(default_factory=dict)  # window -> float64 [T] log p of its own next tokens
    _last_row: Any = None  # the newest window's last-position log-softmax, until its next token is seen
    # Placements, cuts and sources. A short seed (the report's 31-bit one) could be found by
    # trying every value against the batches a model sees; 256 bits cannot. Tests inject their own.
    rng: random.Random = field(default_factory=lambda: random.Random(secrets.randbits(256)))
    _sent: tuple[set[int], set[int]] = field(default_factory=lambda: (set(), set()))  # source windows each server was sent
    calls: int = 0

    @property
    def rows_per_call(self) -> int:
        return (self.batch_size + 1) // 2 + CHECK_ROWS

    # -- building a call -------------------------------------------------------------
    def _candidates(self, server: int, *, copy: bool) -> list[int]:
        """Windows the other server scored (a copy also needs the window after it, for its last target)
        that ``server`` was not yet sent as a check row's source; all of them once none is left."""
        newest = len(self.windows) - 1
        pool = [w for w in range(len(self.windows)) if w % 2 != server and (not copy or w < newest)]
        unsent = [w for w in pool if w not in self._sent[server]]
        return unsent or pool

    def _known(self, server: int) -> list[int]:
        """Windows ``server`` has already been shown (its own scored ones, sources it was sent): a splice's
        tail or a filler from these tells it nothing about a window it may later get as a source."""
        return [w for w in range(len(self.windows)) if w % 2 == server or w in self._sent[server]]

    def _check(self, server: int, length: int) -> _Check | None:
        import torch

        splice = self.rng.random() < SPLICE_SHARE or length < 2
        pool = self._candidates(server, copy=not splice)
        if not pool:
            pool, splice = self._candidates(server, copy=False), True
        if not pool or len(self.windows) < 2:
            return None
        source = self.rng.choice(pool)
        self._sent[server].add(source)
        row = self.windows[source]
        if not splice:
            return _Check("copy", source, length, row.clone())
        cut = self.rng.randint(1, length - 1)
        donors = [w for w in self._known(server) if w != source] or [w for w in range(len(self.windows)) if w != source]
        donor = self.rng.choice(donors)
        start = self.rng.randint(1, cut)  # ends inside the donor window: no window starts where it stops
        tail = self.windows[donor][start:start + length - cut]
        return _Check("splice", source, cut, torch.cat([row[:cut], tail]), donor)

    def _fill(self, server: int, rows: int, length: int) -> list[_Check]:
        checks = []
        for _ in range(rows):
            check = self._check(server, length)
            if check is None:  # the very first call: nothing scored yet to copy; real text still fills the slot
                known = self._known(server)
                donor = self.rng.choice(known) if known else self.rng.randrange(len(self.windows))
                self._sent[server].add(donor)
                check = _Check("filler", -1, 0, self.windows[donor].clone())
            checks.append(check)
        return checks

    # -- the scorer's call -----------------------------------------------------------
    def __call__(self, idx: Any) -> Any:
        import torch

        x = idx.detach().to("cpu", torch.int64)
        count, length = x.shape
        first = len(self.windows)
        self._seen(x)
        plans = []
        for server in (0, 1):
            scored = [k for k in range(count) if (first + k) % 2 == server]
            checks = self._fill(server, self.rows_per_call - len(scored), length)
            slots = list(range(self.rows_per_call))
            self.rng.shuffle(slots)
            batch = torch.empty(self.rows_per_call, length, dtype=torch.int64)
            for slot, k in zip(slots, scored, strict=False):
                batch[slot] = x[k]
            for slot, check in zip(slots[len(scored):], checks, strict=True):
                batch[slot] = check.tokens
            plans.append((scored, checks, slots, batch))
        for server, (_, _, _, batch) in enumerate(plans):
            self.servers[server].send_forward(batch)
        out: Any = None
        for server, (scored, checks, slots, _) in enumerate(plans):
            logits = self.servers[server].receive_forward(self.vocab_limit)
            if out is None:
                out = torch.empty(count, length, logits.shape[-1], dtype=torch.float32)
            elif logits.shape[-1] != out.shape[-1]:
                self.evidence.problem = "the two servers of the scored pass returned logits over different vocabularies"
            lse = torch.logsumexp(logits, dim=-1)  # [rows, T]: log p = logit - lse, in one pass per call
            for slot, k in zip(slots, scored, strict=False):
                out[k] = logits[slot]
                self._sign(first + k, logits[slot], lse[slot])
            plans[server] = (scored, checks, slots[len(scored):], (logits, lse))
        for _, checks, check_slots, (logits, lse) in plans:
            for slot, check in zip(check_slots, checks, strict=True):
                self._compare(check, logits[slot], lse[slot])
        self.calls += 1
        return out

    def _seen(self, x: Any) -> None:
        """Record the new windows; the previous newest window's last target is now known."""
        if self._last_row is not None and len(self.windows):
            newest = len(self.windows) - 1
            self._signatures[newest][-1] = float(self._last_row[int(x[0, 0])])
            self._last_row = None
        for row in x:
            self.windows.append(row.clone())

    def _sign(self, window: int, logits: Any, lse: Any) -> None:
        """The window's signature: log p of its own next token at every position (float64 of float32 sums)."""
        import torch

        row = self.windows[window]
        signature = torch.full((row.shape[0],), float("nan"), dtype=torch.float64)
        signature[:-1] = (logits[:-1].gather(1, row[1:].unsqueeze(1)).squeeze(1) - lse[:-1]).double()
        if window + 1 < len(self.windows):
            signature[-1] = float(logits[-1, int(self.windows[window + 1][0])] - lse[-1])
        else:
            self._last_row = (logits[-1] - lse[-1]).double()
        self._signatures[window] = signature

    def _compare(self, check: _Check, logits: Any, lse: Any) -> None:
        import torch

        if check.kind == "filler":
            return
        row = self.windows[check.source]
        shared = check.shared
        targets = torch.cat([row[1:], self.windows[check.source + 1][:1]])[:shared] if check.kind == "copy" else row[1:shared + 1]
        mine = (logits[:shared].gather(1, targets.unsqueeze(1)).squeeze(1) - lse[:shared]).double()
        full = self._signatures[check.source][:shared] - mine
        keep = torch.ones(shared, dtype=torch.bool) if self.token_bytes is None else self.token_bytes[targets] > 0
        diff = full[keep]
        if not diff.numel():
            return
        self.evidence.positions += int(diff.numel())
        if check.kind == "splice":
            if bool(keep[-1]):
                self.evidence.splices += 1
                self.evidence.splice_sum += float(full[-1])
        else:
            self.evidence.copies += 1
            self.evidence.copy_sum += float(diff.sum())
            self.evidence.copy_positions += int(diff.numel())
        finite = bool(torch.isfinite(diff).all())
        worst = float(diff.abs().max()) if finite else float("inf")
        if worst > self.evidence.worst:
            at = int(full.abs().nan_to_num(float("inf")).masked_fill(~keep, -1.0).argmax())
            self.evidence.worst = worst
            self.evidence.worst_where = _explain(check, at, float(full[at]))


def _explain(check: _Check, position: int, diff: float) -> str:
    gap = f"log-probabilities {abs(diff):.3g} nats apart (tolerance {TOL_POSITION:g})"
    if check.kind == "splice" and position == check.shared - 1:
        return (f"scored window {check.source} and a check row with the same first {check.shared} tokens (then other validation "
                f"text, from window {check.donor}) give the window's next token at position {position} {gap}: the model's output "
                "there depends on the token after it")
    what = (f"a check row with the same first {check.shared} tokens (then other text)" if check.kind == "splice"
            else "its copy in another batch of another process")
    return (f"scored window {check.source} and {what} give position {position}'s next token {gap}: the model's output depends "
            "on more than its own prefix (later tokens, other rows, earlier calls or chance)")
