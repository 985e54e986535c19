"""Dynamic batching in `cometnmt serve`: one client's latency and C concurrent clients' sentences
per second, each client sending one sentence per request, for three servers side by side:

* ``off``: no batching (``--batch-wait-ms 0``), each request decoded alone;
* ``wait``: a batch always waits ``--batch-wait-ms`` for more requests after its first (the
  batcher before 2026-11-28, which held a lone request to an idle server that long);
* ``on``: the defaults, a batch decoded at once when the model is free, ``--batch-wait-ms`` only
  the bound of a wait while the model is busy (RequestBatcher's ``busy``).

    python bench/bench_serve.py                      # trains configs/tiny.yaml on 300 pairs first (~1 min)
    python bench/bench_serve.py --checkpoint best.pt --clients 8 --requests 40 --threads 2

The servers run in this process on one Translator each, in turn, the order rotating between the
``--rounds`` (off wait on, wait on off, on off wait, ...), on the CPU unless ``--device`` says otherwise; the sentences are Multi30k's test
sources (German). The table goes to stdout; nothing is asserted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def tiny_checkpoint(folder: Path, data_dir: str) -> Path:
    import cometnmt
    from cometnmt.config import load_config

    cfg = load_config(REPO / "configs" / "tiny.yaml", [
        f"data.multi30k_dir={data_dir}", "data.max_train_pairs=300", "data.max_valid_pairs=20", "train.batch_tokens=600",
        "train.max_epochs=1", "train.valid_bleu=false", "train.progress=false", f"train.save_dir={folder}"])
    cometnmt.train(cfg)
    return folder / "best.pt"


def multi30k_dir() -> str:
    """The Multi30k folder the bench scripts read: $COMETNMT_MULTI30K_DIR, else ../shared's copy."""
    return os.environ.get("COMETNMT_MULTI30K_DIR", str(REPO.parent / "shared" / "data" / "multi30k"))


def test_sources(lang: str = "de", limit: int | None = None) -> list[str]:
    """The first ``limit`` lines (None: all) of Multi30k's test_2016_flickr in language ``lang``."""
    with gzip.open(Path(multi30k_dir()) / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def run_clients(port: int, sentences: list[str], clients: int, requests: int, latencies: list | None = None) -> float:
    """Sentences per second: ``clients`` threads, each sending ``requests`` one-sentence requests in
    turn; each request's seconds are added to ``latencies``, if given."""
    errors = []

    def client(c: int) -> None:
        for r in range(requests):
            body = json.dumps({"text": sentences[(c * requests + r) % len(sentences)]}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/translate", body,
                                         {"Content-Type": "application/json"})
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=300) as resp:
                    resp.read()
            except Exception as exc:  # counted, not raised: the table says so
                errors.append(exc)
            if latencies is not None:
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]!r}")
    return clients * requests / elapsed


def counting(translate, sizes: list[int]):
    """``translate`` (a server's Translator's), noting the sentences of each call in ``sizes``."""

    def counted(texts, *args, **kwargs):
        sizes.append(len(texts))
        return translate(texts, *args, **kwargs)

    return counted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="a trained checkpoint (default: train configs/tiny.yaml for a minute)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--requests", type=int, default=25, help="requests per client per round (default 25)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each timing off, wait and on (default 3)")
    p.add_argument("--latency-requests", type=int, default=20,
                   help="one client's requests per server per round, for the latency (default 20)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's choice)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--beam", type=int, help="the servers' beam (default: the checkpoint's search)")
    p.add_argument("--max-batch-sentences", type=int, default=64)
    p.add_argument("--batch-wait-ms", type=float, default=5.0)
    p.add_argument("--out", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    import torch
    from cometnmt.serve import make_server

    if args.threads:
        torch.set_num_threads(args.threads)
    data_dir, sentences = multi30k_dir(), test_sources("de", 500)
    names = ("off", "wait", "on")
    batches: dict[str, list[int]] = {name: [] for name in names}  # the sentences of each translate call (a batch)
    rates: dict[str, list[float]] = {name: [] for name in names}
    latency_ms: dict[str, list[float]] = {name: [] for name in names}  # a round's median
    per_batch: dict[str, list[float]] = {name: [] for name in names}  # a round's mean sentences a batch, C clients
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or str(tiny_checkpoint(Path(tmp) / "run", data_dir))
        servers = {}
        for name in names:
            srv = make_server(checkpoint, port=0, device=args.device, beam=args.beam,
                              batch_wait_ms=0.0 if name == "off" else args.batch_wait_ms,
                              max_batch_sentences=args.max_batch_sentences)
            if name == "wait":
                srv.batcher.busy = None  # every batch waits --batch-wait-ms, as before
            srv.translator.translate = counting(srv.translator.translate, batches[name])
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            servers[name] = srv
        for name in names:  # warm-up, untimed
            run_clients(servers[name].server_port, sentences, args.clients, 2)
        orders = []
        for r in range(args.rounds):
            # the order rotating (off wait on, wait on off, on off wait, ...): a machine whose speed
            # drifts through a round does not favour one server in every round
            orders.append(names[r % len(names):] + names[: r % len(names)])
            for name in orders[-1]:
                port, seconds = servers[name].server_port, []
                run_clients(port, sentences, 1, args.latency_requests, seconds)
                latency_ms[name].append(statistics.median(seconds) * 1000)
                batches[name].clear()
                rates[name].append(run_clients(port, sentences, args.clients, args.requests))
                per_batch[name].append(statistics.mean(batches[name]))
        for srv in servers.values():
            srv.shutdown()
            srv.server_close()
    rate = {name: statistics.median(rates[name]) for name in names}
    latency = {name: statistics.median(latency_ms[name]) for name in names}
    print(f"{args.clients} clients x {args.requests} one-sentence requests (throughput) and 1 client x "
          f"{args.latency_requests} (latency), {args.rounds} rounds, device {args.device}, torch threads "
          f"{torch.get_num_threads()}, --max-batch-sentences {args.max_batch_sentences}, --batch-wait-ms {args.batch_wait_ms:g}")
    print(f"{'batching':28} {'1 client ms':>11} {'sentences/s':>11} {'sentences a batch':>17}  (medians; rounds below)")
    labels = {"off": "off", "wait": "wait (fixed wait, before)", "on": "on (at once when idle)"}
    for name in names:
        print(f"{labels[name]:28} {latency[name]:11.1f} {rate[name]:11.1f} {statistics.median(per_batch[name]):17.2f}")
    for name in names:
        print(f"  {name:5} ms {' '.join(f'{v:.1f}' for v in latency_ms[name])}; sentences/s "
              f"{' '.join(f'{v:.1f}' for v in rates[name])}; a batch {' '.join(f'{v:.2f}' for v in per_batch[name])}")
    print(f"on/off: {rate['on'] / rate['off']:.2f}x sentences/s; on/wait: {rate['on'] / rate['wait']:.2f}x sentences/s, "
          f"{latency['on'] / latency['wait']:.2f}x one client's latency")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), **rates, "latency_ms": latency_ms, "per_batch": per_batch,
                                              "ratio": rate["on"] / rate["off"], "orders": orders}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
