"""Decoding speed: sentences/s and output tokens/s, fp32 / bf16 / int8, greedy and beam 5, against a baseline.

    python scripts/bench_decode.py --threads 2                              # untrained models, fixed output length
    python scripts/bench_decode.py --threads 2 \
        --checkpoint runs/m30k_tf runs/m30k_bahdanau                        # trained models: own lengths, BLEU
    python scripts/bench_decode.py --threads 2 --baseline b3c1183 --ct2     # also a commit's search and CTranslate2

Source: Multi30k test_2016_flickr (English, 1,000 sentences) from --data (default ../shared/data/multi30k).
Models: without --checkpoint, untrained models of the recipes' shapes (recipes/model/{transformer,bahdanau,
luong}.yaml: a 3+3-layer d256 Transformer, a 1-layer GRU Bahdanau model, a 2-layer LSTM Luong model, all
d256) over a joint SentencePiece vocabulary of 8,000 trained on Multi30k train. An untrained model's outputs
end at random, so each output is held at exactly --fixed-len tokens (min length = max length; default: the
mean length of the German references in subword tokens), the work a trained model's outputs of that length
need. With --checkpoint, trained models decode with their own lengths (beam 5 with --alpha, default 0: the one
length penalty CTranslate2 applies as nmt does; with --alpha 0.6, as the figures of 2026-12-01 were measured,
CTranslate2 divides by length ** 0.6 and nmt by ((5 + length) / 6) ** 0.6, not the same ranking) and BLEU
against the references is printed for each precision.

With --shortlist a vocabulary shortlist is built with nmt-shortlist from Multi30k train for each model, and
rows "nmt+sl" (decode.shortlist) and, with --ct2, "ct2+vmap" (the same file as the export's vmap.txt,
use_vmap=True) are added.

Every measurement runs in a fresh process (`--worker`) that loads the model, decodes a few sentences to warm
up (a batch per replica with --replicas), then times --runs runs over all sentences; with --rounds R every row is
measured so in R processes, round by round (round k of every row before round k + 1 of any: a slow spell of a
shared machine, which can last minutes and cost 10-20%, is spread over all rows): the figures are the median
wall-clock time, the CPU time of the process per sentence (steadier than the wall clock on a shared machine), and
the peak resident set size
(the process's high-water mark, and its rise while decoding, sampled every 5 ms). With --baseline REV the same
worker first runs the search of commit REV (its nmt/ extracted with `git archive`, fp32 only), and the table
gives each row's speed over the baseline's (wall clock) and how many outputs equal this code's fp32 ones. With --ct2 the
Transformer is exported with nmt-export and timed in CTranslate2 (pip install ctranslate2) with the same
batch size, beam, threads and output length. --unbatched N also decodes the first N sentences one at a
time with beam 5 and checks that the batched outputs equal them. --replicas N adds rows "nmt xN"
(nmt-translate workers=N: N spawned single-threaded processes, each with its own copy of the model, searching
whole batches) and "ct2 xN" (CTranslate2 with inter_threads=N, intra_threads=1), timed by the wall clock;
their CPU time and memory columns count the parent process only. --profile prints torch.profiler's top
operators for beam 5 of each model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ("transformer", "bahdanau", "luong")


# --- the worker: one model, one setting, in its own process -------------------------------------


def peak_mib() -> float:
    """The largest resident set size this process has had (its high-water mark), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """Resident set size of this process now (Linux /proc), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakMemory:
    """The largest resident set size seen while the block runs (sampled every 5 ms)."""

    def __enter__(self) -> PeakMemory:
        self.before = self.peak = rss_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_mib())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib())


def timed(decode, lines: list[str], runs: int, warm: int = 8) -> dict:
    """Median wall and CPU seconds of `runs` calls of decode(lines) after a warm-up on the first `warm` lines (enough
    for a batch per replica, so that every worker process has searched once), peak memory, the last outputs."""
    decode(lines[:warm])
    walls, cpus, rises = [], [], []
    for _ in range(runs):
        with PeakMemory() as memory:
            wall, cpu = time.perf_counter(), time.process_time()
            outputs = decode(lines)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        rises.append(memory.peak - memory.before)
    return {
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "walls": walls,
        "cpus": cpus,
        "rise_mib": max(rises),
        "outputs": outputs,
    }


def warm_lines(job: dict) -> int:
    """Lines of the warm-up: 8, or a batch for each of several replicas (each must have searched once)."""
    replicas = job.get("replicas", 1)
    return job["batch"] * replicas if replicas > 1 else 8


def nmt_worker(job: dict) -> dict:
    """Decode with the nmt package found first on sys.path (this tree or a baseline's)."""
    import torch
    from omegaconf import OmegaConf

    from nmt.config import DecodeConfig, ModelConfig
    from nmt.data.tokenizer import Tokenizer
    from nmt.training.checkpoint import load_checkpoint
    from nmt.translation import Translator

    try:
        from nmt.models.builders import build_model
    except ImportError:  # a baseline from before nmt.models.builders
        from nmt.models.seq2seq import build_model

    # only the model section of the saved config, so that a baseline whose other schemas differ loads it too
    payload = load_checkpoint(job["checkpoint"])
    model_cfg = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.create(payload["config"]).model)
    )
    tokenizer = Tokenizer.from_state(payload["tokenizer"])
    model = build_model(model_cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.joint)
    model.load_state_dict(payload["model"])
    model.eval()
    # the decoding copy nmt.load / nmt-translate / nmt-serve make (fused projections, the fp32 backend's linears;
    # before 2026-12-03 fp32 rows of one process ran the plain model); a baseline without one runs its plain model
    try:
        from nmt.engine import PRECISIONS, decoding_copy
    except ImportError:  # a baseline from before nmt.engine, or before decoding copies
        try:
            from nmt.models.quantize import PRECISIONS
            from nmt.models.quantize import to_precision as decoding_copy
        except ImportError:
            PRECISIONS, decoding_copy = (), None
    if job["precision"] in PRECISIONS:
        model = decoding_copy(model, job["precision"])
    elif job["precision"] != "fp32":
        raise SystemExit(f"this tree has no precision {job['precision']}")
    fixed, beam = job["fixed_len"], job["beam"]
    settings = dict(beam=beam, batch_size=job["batch"])
    settings.update(
        dict(max_len_a=0.0, max_len_b=fixed, min_len=fixed) if fixed else dict(alpha=job["alpha"] if beam > 1 else 0.0)
    )
    if job["precision"] != "fp32":
        settings["precision"] = job["precision"]
    if job.get("shortlist"):
        settings["shortlist"] = job["shortlist"]
    if "scores" in {f.name for f in fields(DecodeConfig)}:  # a baseline commit may not have the key
        settings["scores"] = False  # as nmt-translate (one text per line, no score shown) and CTranslate2 (no
        # return_scores) decode: greedy search skips the normaliser (the outputs are the same)
    translator = Translator(model, tokenizer, DecodeConfig(**settings), torch.device("cpu"))
    if (
        job.get("replicas", 1) > 1
    ):  # nmt-translate workers=N: N processes of `threads` threads each search whole batches
        from nmt.workers import SearchPool

        translator.pool = SearchPool(job["checkpoint"], translator.decode, "cpu", job["replicas"], job["threads"])

    def decode(lines: list[str]) -> list[list[int]]:
        return [r.hyps[0].tokens if r.hyps else [] for r in translator.translate_lines(lines)]

    result = timed(decode, job["lines"], job["runs"], warm_lines(job))
    result["peak_mib"] = peak_mib()  # before the extra runs below (the profiler's own memory would count)
    result["text"] = tokenizer.decode_tgt(result["outputs"])
    if translator.pool:
        translator.pool.close()
    if job.get("unbatched"):
        subset = job["lines"][: job["unbatched"]]
        alone = Translator(model, tokenizer, DecodeConfig(**{**settings, "batch_size": 1}), torch.device("cpu"))
        one = timed(lambda lines: [r.hyps[0].tokens for r in alone.translate_lines(lines)], subset, 1)
        result["unbatched"] = {
            "sentences": len(subset),
            "wall_s": one["wall_s"],
            "same": one["outputs"] == result["outputs"][: len(subset)],
        }
    if job.get("profile"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            decode(job["lines"][:256])
        result["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    return result


def ct2_worker(job: dict) -> dict:
    """Decode with CTranslate2 from the model directory nmt-export wrote."""
    import ctranslate2
    import sentencepiece as spm

    folder = Path(job["ct2_dir"])
    joint = (folder / "sentencepiece.model").is_file()
    sp_src = spm.SentencePieceProcessor(model_file=str(folder / ("sentencepiece.model" if joint else "source.model")))
    sp = spm.SentencePieceProcessor(model_file=str(folder / ("sentencepiece.model" if joint else "target.model")))
    replicas = job.get("replicas", 1)
    translator = ctranslate2.Translator(
        str(folder), device="cpu", compute_type=job["precision"], intra_threads=job["threads"], inter_threads=replicas
    )
    fixed = job["fixed_len"]

    def decode(lines: list[str]) -> list[list[int]]:
        """Shortest first in batches of job["batch"] as nmt does, each with nmt's length limit
        (1.5 * longest source + 10)."""
        pieces = [sp_src.encode(line, out_type=str) for line in lines]
        order = sorted(range(len(lines)), key=lambda i: len(pieces[i]))
        outputs: list[list[int]] = [[] for _ in lines]
        pending = []  # with several replicas every batch is submitted at once (asynchronous) so that they all work
        for start in range(0, len(order), job["batch"]):
            batch = order[start : start + job["batch"]]
            longest = max(len(pieces[i]) for i in batch)
            limits = (
                dict(min_decoding_length=fixed, max_decoding_length=fixed)
                if fixed
                else dict(max_decoding_length=int(1.5 * longest + 10), length_penalty=job["alpha"])
            )
            results = translator.translate_batch(
                [pieces[i] for i in batch],
                beam_size=job["beam"],
                suppress_sequences=[["<pad>"], ["<s>"]],
                asynchronous=replicas > 1,
                use_vmap=bool(job.get("vmap")),
                **limits,
            )
            pending.append((batch, results))
        for batch, results in pending:
            for i, r in zip(batch, results):
                outputs[i] = [sp.piece_to_id(p) for p in (r.result() if replicas > 1 else r).hypotheses[0]]
        return outputs

    result = timed(decode, job["lines"], job["runs"], warm_lines(job))
    result["text"] = [sp.decode(ids) for ids in result["outputs"]]
    return result


def worker(job_file: str) -> None:
    job = json.loads(Path(job_file).read_text())
    import torch

    if (
        job["engine"] == "nmt"
    ):  # the allocator set-up of the nmt CLIs (nmt.memory; a baseline commit without it runs without)
        try:
            from nmt.memory import tune_allocator

            tune_allocator()
        except ImportError:
            pass

    torch.set_num_threads(job["threads"])
    result = ct2_worker(job) if job["engine"] == "ct2" else nmt_worker(job)
    result.setdefault("peak_mib", peak_mib())
    Path(job["out"]).write_text(json.dumps(result))


# --- the driver ----------------------------------------------------------------------------------


def run_job(job: dict, tree: Path, work: Path) -> dict:
    """Run one worker process with `tree`'s nmt first on its path; its result dict."""
    job_file, out = work / "job.json", work / "result.json"
    job = {**job, "out": str(out)}
    job_file.write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"]), "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", str(job_file)], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"worker failed ({job['engine']}, {job.get('precision')}):\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def untrained_checkpoints(args, work: Path) -> tuple[list[tuple[str, Path]], int]:
    """Untrained models of the recipes' shapes saved as checkpoints (so every worker loads the same weights),
    and the fixed length."""
    import torch
    from omegaconf import OmegaConf

    from nmt.config import Config, DataConfig, ModelConfig
    from nmt.data.corpus import read_lines
    from nmt.data.tokenizer import Tokenizer
    from nmt.models.builders import build_model
    from nmt.training.checkpoint import save_checkpoint

    start = time.perf_counter()
    tokenizer = Tokenizer.train(
        read_lines(args.data / "train.en.gz"),
        read_lines(args.data / "train.de.gz"),
        args.vocab_size,
        "unigram",
        joint=True,
    )
    refs = tokenizer.encode_tgt(read_lines(args.data / "test_2016_flickr.de.gz"))
    fixed_len = args.fixed_len or round(statistics.mean(len(r) for r in refs))
    print(
        f"tokenizer trained in {time.perf_counter() - start:.0f}s; untrained models, outputs held at {fixed_len} tokens"
    )
    found = []
    for arch in args.archs:
        recipe = OmegaConf.merge(
            OmegaConf.structured(ModelConfig),
            OmegaConf.load(ROOT / "recipes" / "model" / f"{arch}.yaml"),
            {"dropout": 0.0},
        )
        model_cfg = OmegaConf.to_object(recipe)
        torch.manual_seed(0)
        model = build_model(model_cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, True)
        path = work / f"{arch}.pt"
        save_checkpoint(path, model, Config(data=DataConfig(train="unused"), model=model_cfg), tokenizer, step=0)
        found.append((f"{arch} (untrained, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)", path))
    return found, fixed_len


def export_ct2(checkpoint: Path, work: Path, shortlist: Path | None = None) -> Path | None:
    """The Transformer exported with nmt-export for --ct2, with the shortlist as its vmap.txt if given (None if
    it is not a Transformer)."""
    out = work / f"ct2_{checkpoint.stem}{'_vmap' if shortlist else ''}"
    extra = [f"shortlist={shortlist}"] if shortlist else []
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt.cli.export",
            f"checkpoint={checkpoint}",
            "format=ctranslate2",
            f"out={out}",
            *extra,
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    return out if done.returncode == 0 else None


def make_shortlist(checkpoint: Path, args, work: Path) -> Path:
    """nmt-shortlist over Multi30k train (--data) for this checkpoint's tokenizer."""
    out = work / f"shortlist_{checkpoint.stem}.tsv"
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt.cli.shortlist",
            f"checkpoint={checkpoint}",
            f"out={out}",
            f"src={args.data / 'train.en.gz'}",
            f"tgt={args.data / 'train.de.gz'}",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"nmt-shortlist failed:\n{done.stderr[-2000:]}")
    print(f"shortlist built in {time.perf_counter() - start:.0f}s: {done.stdout.strip()}")
    return out


def bleu(text: list[str], refs: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(text, [refs]).score


def bench_model(
    name: str,
    checkpoint: Path,
    lines: list[str],
    refs: list[str],
    args,
    fixed_len: int | None,
    baseline: Path | None,
    work: Path,
) -> None:
    """One table per model: every engine and precision, greedy and beam, with ratios against the baseline's fp32."""
    print(f"\n== {name}: {len(lines)} sentences, batch {args.batch}, {args.threads} thread(s) ==")
    print(
        f"{'engine':<16} {'search':<7} {'sent/s':>7} {'tok/s':>7} {'cpu ms/sent':>11} {'peak MiB':>8} {'rise MiB':>8} "
        f"{'vs base':>7} {'same as fp32':>12}" + ("  BLEU" if fixed_len is None else ""),
        flush=True,
    )
    ct2_dir = export_ct2(checkpoint, work) if args.ct2 else None
    shortlist = make_shortlist(checkpoint, args, work) if args.shortlist else None
    vmap_dir = export_ct2(checkpoint, work, shortlist) if args.ct2 and shortlist else None
    engines = ["nmt", *(["nmt+sl"] if shortlist else [])]
    ct2_engines = [*(["ct2"] if ct2_dir else []), *(["ct2+vmap"] if vmap_dir else [])]
    rows = (
        ([("baseline", "fp32")] if baseline else [])
        + [(e, p) for e in engines for p in args.precisions]
        + [(e, t) for e in ct2_engines for t in args.ct2_types]
    )
    if args.replicas > 1:  # the same precisions as `replicas` single-threaded processes (CTranslate2: inter_threads)
        rows += [(f"{e} x{args.replicas}", p) for e in engines for p in args.precisions] + [
            (f"{e} x{args.replicas}", t) for e in ct2_engines for t in args.ct2_types
        ]
    for beam in args.beams:
        common = dict(
            checkpoint=str(checkpoint),
            lines=lines,
            beam=beam,
            batch=args.batch,
            fixed_len=fixed_len,
            alpha=args.alpha,
            runs=args.runs,
            threads=args.threads,
        )
        results: dict = {}
        for turn in range(args.rounds):  # round k of every row before round k + 1 of any, each starting one row
            # further on: a slow spell of a shared machine is spread over the rows instead of falling on a few
            for engine, precision in rows[turn % len(rows) :] + rows[: turn % len(rows)]:
                found = time_row(
                    engine, precision, turn == 0, common, args, baseline, ct2_dir, vmap_dir, shortlist, work
                )
                if (engine, precision) not in results:
                    results[engine, precision] = found
                    continue
                kept = results[engine, precision]
                kept["walls"] += found["walls"]
                kept["cpus"] += found["cpus"]
                kept["rise_mib"] = max(kept["rise_mib"], found["rise_mib"])
                kept["peak_mib"] = max(kept["peak_mib"], found["peak_mib"])
        for r in results.values():
            r["wall_s"], r["cpu_s"] = statistics.median(r["walls"]), statistics.median(r["cpus"])
        print_rows(results, lines, beam, baseline, fixed_len, refs)


def time_row(engine, precision, first, common, args, baseline, ct2_dir, vmap_dir, shortlist, work) -> dict:
    """One row's job in a fresh process: --runs timed runs (the unbatched and profile extras in the first round)."""
    replicated = engine.endswith(f" x{args.replicas}")
    listed = "+" in engine
    job = {
        **common,
        "engine": "ct2" if engine.startswith("ct2") else "nmt",
        "precision": precision,
        "ct2_dir": str(vmap_dir if listed and engine.startswith("ct2") else ct2_dir),
        "shortlist": str(shortlist) if listed else None,
        "vmap": listed and engine.startswith("ct2"),
    }
    if replicated:
        job.update(threads=1, replicas=args.replicas)
    beam = common["beam"]
    if engine == "nmt" and precision == "fp32" and first:
        job.update(unbatched=args.unbatched if beam > 1 else 0, profile=args.profile and beam > 1)
    return run_job(job, baseline if engine == "baseline" else ROOT, work)


def print_rows(results: dict, lines: list[str], beam: int, baseline, fixed_len, refs) -> None:
    """The table's rows of one beam size."""
    reference = results.get(("nmt", "fp32"), next(iter(results.values())))["outputs"]
    for (engine, precision), r in results.items():
        tokens = sum(len(o) for o in r["outputs"])
        versus = f"{results['baseline', 'fp32']['wall_s'] / r['wall_s']:.2f}x" if baseline else ""
        same = sum(a == b for a, b in zip(r["outputs"], reference))
        print(
            f"{engine + ' ' + precision:<16} {('greedy' if beam == 1 else f'beam {beam}'):<7} "
            f"{len(lines) / r['wall_s']:>7.1f} {tokens / r['wall_s']:>7.0f} "
            f"{1000 * r['cpu_s'] / len(lines):>11.2f} {r['peak_mib']:>8.0f} {r['rise_mib']:>8.0f} {versus:>7} "
            f"{same:>5}/{len(lines):<6}" + (f"  {bleu(r['text'], refs):.2f}" if fixed_len is None else ""),
            flush=True,
        )
    for r in results.values():
        if "unbatched" in r:
            u = r["unbatched"]
            print(
                f"  beam {beam} one sentence at a time ({u['sentences']} sentences): "
                f"{u['sentences'] / u['wall_s']:.1f} sent/s; batched outputs "
                f"{'equal' if u['same'] else 'DIFFER FROM'} the unbatched ones"
            )
        if "profile" in r:
            print(f"  torch.profiler, nmt fp32, beam {beam}, 256 sentences:\n{r['profile']}")


def baseline_tree(rev: str, work: Path) -> Path:
    """The nmt/ package of commit `rev`, extracted with git archive."""
    tree = work / f"baseline_{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "nmt"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument(
        "--checkpoint",
        nargs="+",
        type=Path,
        help="trained checkpoints or run dirs (else untrained models, fixed length)",
    )
    parser.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS, help="untrained models to build")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "int8"], choices=["fp32", "bf16", "int8"])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch (decode.batch_size)")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch intra-op threads (and CTranslate2's intra_threads)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every row in this many fresh processes, round by round (the median is over all their runs)",
    )
    parser.add_argument("--sentences", type=int, default=1000, help="the first N test sentences")
    parser.add_argument("--unbatched", type=int, default=100, help="sentences for beam 5 one at a time (0: skip)")
    parser.add_argument("--fixed-len", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--baseline", metavar="REV", help="also time the search of this git commit (fp32)")
    parser.add_argument("--ct2", action="store_true", help="also time the Transformer in CTranslate2")
    parser.add_argument(
        "--shortlist",
        action="store_true",
        help="also decode with a vocabulary shortlist (nmt-shortlist over --data's train; CTranslate2: its vmap)",
    )
    parser.add_argument("--ct2-types", nargs="+", default=["float32", "int8"], help="CTranslate2 compute types")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="also decode with N single-threaded processes (nmt-translate workers=N; CTranslate2 inter_threads=N)",
    )
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's top operators (beam, fp32)")
    parser.add_argument(
        "--alpha",
        type=float,
        default=0.0,
        help="trained models, beam > 1: nmt's decode.alpha and CTranslate2's length_penalty. 0 (default) is the one "
        "value where the two searches rank alike (nmt_export.json); any other ranks differently in the two engines",
    )
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    sys.path.insert(0, str(ROOT))
    import torch

    from nmt.data.corpus import read_lines

    lines = read_lines(args.data / "test_2016_flickr.en.gz")[: args.sentences]
    refs = read_lines(args.data / "test_2016_flickr.de.gz")[: args.sentences]
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    print(
        f"torch {torch.__version__}; {cpu}, {os.cpu_count()} cores; load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (others' work slows a shared machine: compare rows of one "
        "run)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        baseline = baseline_tree(args.baseline, work) if args.baseline else None
        if args.checkpoint:
            from nmt.training.checkpoint import resolve_checkpoint

            models, fixed_len = [(f"{path} (trained)", resolve_checkpoint(str(path))) for path in args.checkpoint], None
        else:
            models, fixed_len = untrained_checkpoints(args, work)
        for name, path in models:
            bench_model(name, path, lines, refs, args, fixed_len, baseline, work)


if __name__ == "__main__":
    main()
