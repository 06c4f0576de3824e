"""Every combination of decoding options either works or is refused with one line naming what conflicts: search
(greedy, beam, sampling) x precision x shortlist x prefix x constraints x repetition control x n-best x ensemble.

What works gives one output per line, starting with its prefix and holding its constraints; what is refused is
exactly `refused` (docs/translation.md, "Which options combine"), with an NmtError of one line."""

from __future__ import annotations

import itertools

import pytest

import nmt
from nmt.cli import shortlist as shortlist_cli
from nmt.errors import NmtError
from tests.test_cli import cli
from tests.test_serve import trained_pair

SEARCHES = {"greedy": {"beam": 1}, "beam": {"beam": 3}, "sampling": {"sampling": True, "seed": 3}}


def refused(search: str, prefix: bool, constraints: bool, nbest: int) -> str | None:
    """The combinations nmt refuses, and the words its message must hold."""
    if search == "sampling" and constraints:
        return "constraints with decode.sampling=true"
    if search == "sampling" and prefix:
        return "a target prefix with decode.sampling=true"
    if search == "greedy" and nbest > 1:
        return "decode.nbest=2: at most decode.beam=1"
    return None


@pytest.fixture(scope="module")
def models(tmp_path_factory, toy_dir):
    runs = trained_pair(tmp_path_factory, toy_dir)
    table = tmp_path_factory.mktemp("matrix") / "shortlist.tsv"
    with pytest.raises(SystemExit) as exit_info:
        from nmt.cli.common import run

        run(shortlist_cli.main, [f"checkpoint={runs['b']}", f"out={table}", "frequent=30"])
    assert exit_info.value.code == 0
    loaded = {}
    for precision, shortlist, ensemble in itertools.product(["fp32", "int8"], [False, True], [False, True]):
        path = [runs["b"], runs["b"]] if ensemble else runs["b"]
        extra = {"shortlist": str(table)} if shortlist else {}
        loaded[precision, shortlist, ensemble] = nmt.load(
            path, precision=precision, max_len_a=1.0, max_len_b=8, **extra
        )
    return loaded


def test_every_combination_works_or_is_refused_in_one_line(models, toy_dir):
    sources = (toy_dir / "test.src").read_text().splitlines()[:2]
    word = "hel"
    seen = {"works": 0, "refused": 0}
    seen_models: list[tuple] = []
    for (precision, shortlist, ensemble), model in models.items():
        seen_models.append((precision, shortlist, ensemble))
        # every search x prefix x constraints on every model; repetition control and n-best take turns, so that
        # each of their values meets every other option across the models (96 calls, not 384)
        for i, (search, prefix, constraints) in enumerate(itertools.product(SEARCHES, [False, True], [False, True])):
            turn = i + len(seen_models)
            repetition, nbest = bool(turn % 2), 1 + (turn // 2) % 2
            options = dict(SEARCHES[search], nbest=nbest)
            if prefix:
                options["prefix"] = word
            if constraints:
                options["constraints"] = ["pulkor"]
            if repetition:
                options |= {"no_repeat_ngram_size": 2, "repetition_penalty": 1.3}
            case = (precision, shortlist, ensemble, search, prefix, constraints, repetition, nbest)
            expected = refused(search, prefix, constraints, nbest)
            try:
                out = model.translate(sources, **options)
            except NmtError as error:
                assert expected is not None, (case, str(error))
                assert expected in str(error) and "\n" not in str(error), (case, str(error))
                seen["refused"] += 1
                continue
            assert expected is None, (case, "not refused")
            assert len(out) == len(sources), case
            texts = [o if isinstance(o, str) else o.text for o in out]
            if nbest > 1:
                assert all(len(o.hypotheses) == nbest for o in out), case
            if prefix:
                assert all(t.startswith(word) for t in texts), (case, texts)
            if constraints:  # with a shortlist too: a batch's candidates include its phrases' pieces
                assert all("pulkor" in t for t in texts), (case, texts)
            seen["works"] += 1
    assert seen["works"] and seen["refused"]


def test_the_refusals_are_one_line_from_the_cli_too(models, toy_dir, tmp_path, capsys):
    from nmt.cli import translate as translate_cli

    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "ze bosize", "prefix": "hel", "constraints": ["pulkor"]}\n')
    run_dir = models["fp32", False, False].source
    code, _, err = cli(
        translate_cli.main,
        [
            f"checkpoint={run_dir}",
            f"input={src}",
            f"output={tmp_path}/out",
            "input_format=jsonl",
            "decode.sampling=true",
        ],
        capsys,
    )
    assert code != 0 and err.count("\n") == 1 and "constraints with decode.sampling=true" in err
    assert not (tmp_path / "out").exists()
