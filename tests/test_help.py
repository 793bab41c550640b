"""`python run.py --help` is mdk's own (conf/hydra/help/mdk.yaml): it lists what is really there."""
from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, run_cmd_env
from mdk.stage import chain

STAGES = chain("step4")  # the declared stages in pipeline order


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = "header"
    for line in text.splitlines():
        m = re.fullmatch(r"== (.+?) ==", line.strip())
        if m:
            current = m.group(1).split(" (")[0]
            out[current] = []
        elif line.strip():
            out.setdefault(current, []).append(line)
    return out


def test_help_lists_stages_groups_launchers_commands_and_docs():
    res = subprocess.run([sys.executable, str(REPO / "run.py"), "--help"], env=run_cmd_env(),
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stderr
    s = _sections(res.stdout)
    assert list(s) == ["header", "Stages", "Config groups", "Launchers for -m", "Everyday commands",
                       "Read more"]
    assert "Powered by Hydra" not in res.stdout and res.stdout.startswith("mdk: ")
    # the chain in pipeline order, then the report on it (a stage that trains nothing)
    assert [line.split()[0] for line in s["Stages"]] == [*STAGES, "quant_report"]
    # Every group folder of conf/ with its options (filled in by Hydra), the search configs too.
    groups = dict(line.split(": ", 1) for line in s["Config groups"])
    conf = REPO / "conf"
    expected = {d.name: ", ".join(sorted(p.stem for p in d.glob("*.yaml")))
                for d in conf.iterdir() if d.is_dir() and d.name != "hydra"}
    assert {g: groups.get(g) for g in expected} == expected
    assert "lr_warmup" in groups["hparams_search"]
    presets = [line.split()[0] for line in s["Launchers for -m"] if not line.startswith(" " * 6)]
    assert presets == ["basic", *sorted(p.stem for p in (conf / "hydra" / "launcher").glob("*.yaml"))]
    commands = s["Everyday commands"]
    assert len(commands) == 6 and all(c.strip().startswith("python run.py") for c in commands)
    docs = [line.split()[0] for line in s["Read more"] if not line.startswith("Show")]
    assert "README.md" in docs and {d for d in docs if d.startswith("docs/")} == \
        {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert all((REPO / d).is_file() for d in docs)
    assert "--cfg job" in res.stdout and "--hydra-help" in res.stdout
