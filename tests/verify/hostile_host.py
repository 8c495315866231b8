"""Hostile writes: what archive code leaves where verify could read it back on the host.

The model server's home is a private tmpfs and its output a pipe, so nothing it writes is
ever opened by verify; a dry run's directory is read back only through ``hostfs`` (no link
followed, no FIFO opened, sizes capped, walks bounded). Each case plants a trap and then
fails (so verify has a reason to look): verify must refuse it by the named check, within
its timeout, without quoting anything the trap points at, and leave nothing behind.
"""

from __future__ import annotations

from pathlib import Path

from hostile import Case, Ctx, _runs, _with, pack
from verify_kit import TRAIN_PY

from trnfrontier import submission as fmt

_HOME = "home = os.environ['HOME']\n"
HOST: dict[str, Case] = {
    "server-log-links-to-environ": _runs(at_load=_HOME + "os.symlink('/proc/self/environ', os.path.join(home, '.server.log'))\n"
                                         "raise RuntimeError('see the log')"),
    "server-log-is-a-fifo": _runs(at_load=_HOME + "os.mkfifo(os.path.join(home, '.server.log'))\nraise RuntimeError('see the log')"),
    "server-log-links-to-dev-zero": _runs(at_load=_HOME + "os.symlink('/dev/zero', os.path.join(home, '.server.log'))\n"
                                          "raise RuntimeError('see the log')"),
    "deep-directories-in-home": _runs(at_load=_HOME + "fd = os.open(home, os.O_RDONLY)\nfor _ in range(3000):\n"
                                      "    os.mkdir('d', dir_fd=fd)\n    fd = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
                                      "raise RuntimeError('deep')"),
    "newline-bomb-on-stdout": _runs(at_load="import sys\nfor _ in range(64):\n    sys.stdout.write('\\n' * (1 << 20))\n"
                                    "raise RuntimeError('after the bomb')"),
}


_END = "    if world > 1:\n        torch.distributed.destroy_process_group()\n"


def _dry(snippet: str, says: str, *, at_end: bool = True) -> Case:
    """A train.py whose main() runs ``snippet`` once it has trained and saved (or first thing);
    the dry run runs main, load_for_eval stays honest."""
    def build(ctx: Ctx) -> Path:
        body = "".join(f"    {line}\n" for line in snippet.format(marker=str(ctx.marker)).splitlines())
        assert _END in TRAIN_PY
        source = (TRAIN_PY.replace(_END, body + _END) if at_end
                  else TRAIN_PY.replace("def main():\n    import prepare\n", "def main():\n    import prepare\n" + body))
        return pack(ctx, _with({fmt.TRAIN_PY: source.encode()}))

    return Case(build, "dry-run", dry=True, says=says)


HOST.update({
    "dry-run-step-log-is-a-fifo": _dry("os.remove('step_boundaries.jsonl')\nos.mkfifo('step_boundaries.jsonl')", "step log could not be read: step_boundaries.jsonl is a FIFO"),
    "dry-run-step-log-links-to-environ": _dry("os.remove('step_boundaries.jsonl')\nos.symlink('/proc/self/environ', 'step_boundaries.jsonl')",
                                              "step_boundaries.jsonl is a symbolic link"),
    "dry-run-step-log-links-to-dev-zero": _dry("os.remove('step_boundaries.jsonl')\nos.symlink('/dev/zero', 'step_boundaries.jsonl')",
                                               "step_boundaries.jsonl is a symbolic link"),
    "dry-run-checkpoint-dir-links-out": _dry("import shutil\nshutil.rmtree('out')\nos.symlink({marker!r}, 'out')", "no checkpoint"),
    "dry-run-plants-a-load-scratch": _dry("try:\n    os.symlink('/', '../load-scratch')\nexcept OSError:\n    pass\nraise SystemExit(3)",
                                          "exited 3"),
    "dry-run-deep-directories": _dry("fd = os.open('.', os.O_RDONLY)\nfor _ in range(3000):\n    os.mkdir('d', dir_fd=fd)\n"
                                     "    fd = os.open('d', os.O_RDONLY, dir_fd=fd)", "nested deeper"),
})


def _another_model_when_dry(ctx: Ctx) -> Path:
    """Trains a narrower model when it sees the dry run's variable; load_for_eval takes the width
    from whatever checkpoint it is given, so the dry run's checkpoint loads."""
    source = TRAIN_PY.replace("def main():\n    import prepare\n",
                              "def main():\n    import prepare\n    if os.environ.get('TRNF_DRY_RUN_STEPS'):\n        CONFIG['n_embd'] = 8\n")
    source = source.replace("    model = TinyGPT(**CONFIG)\n    model.load_state_dict(load_safetensors(",
                            "    state = load_safetensors(os.path.join(os.path.dirname(checkpoint_path), 'model.safetensors'))\n"
                            "    model = TinyGPT(CONFIG['vocab_size'], state['wte.weight'].shape[1], CONFIG['seq_len'])\n"
                            "    model.load_state_dict(load_safetensors(")
    assert "state['wte.weight']" in source and "CONFIG['n_embd'] = 8" in source
    return pack(ctx, _with({fmt.TRAIN_PY: source.encode()}))


HOST["dry-run-trains-another-model"] = Case(_another_model_when_dry, "dry-run", dry=True, says="another model")
