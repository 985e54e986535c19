"""Dynamic batching in `cometnmt serve`: sentences per second with C concurrent clients, each
sending one sentence per request, batching on (the defaults) against off (``--batch-wait-ms 0``).

    python bench/bench_serve.py                      # trains configs/tiny.yaml on 300 pairs first (~1 min)
    python bench/bench_serve.py --checkpoint best.pt --clients 8 --requests 40 --threads 2

Both servers run in this process on one Translator each, in turn (off, on, off, on, ... for
``--rounds``), on the CPU unless ``--device`` says otherwise; the sentences are Multi30k's test
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


def run_clients(port: int, sentences: list[str], clients: int, requests: int) -> float:
    """Sentences per second: ``clients`` threads, each sending ``requests`` one-sentence requests in turn."""
    errors = []

    def client(c: int) -> None:
        for r in range(requests):
            body = json.dumps({"text": sentences[(c * requests + r) % len(sentences)]}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/translate", body,
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as resp:
                    resp.read()
            except Exception as exc:  # counted, not raised: the table says so
                errors.append(exc)

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="a trained checkpoint (default: train configs/tiny.yaml for a minute)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--requests", type=int, default=25, help="requests per client per round (default 25)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each timing off then on (default 3)")
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
    data_dir = os.environ.get("COMETNMT_MULTI30K_DIR", str(REPO.parent / "shared" / "data" / "multi30k"))
    with gzip.open(Path(data_dir) / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f][:500]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or str(tiny_checkpoint(Path(tmp) / "run", data_dir))
        servers = {}
        for name, wait in (("off", 0.0), ("on", args.batch_wait_ms)):
            srv = make_server(checkpoint, port=0, device=args.device, beam=args.beam, batch_wait_ms=wait,
                              max_batch_sentences=args.max_batch_sentences)
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            servers[name] = srv
        run_clients(servers["off"].server_port, sentences, args.clients, 2)  # warm-up, untimed
        run_clients(servers["on"].server_port, sentences, args.clients, 2)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for name in ("off", "on"):
                rates[name].append(run_clients(servers[name].server_port, sentences, args.clients, args.requests))
        for srv in servers.values():
            srv.shutdown()
            srv.server_close()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"{args.clients} clients x {args.requests} one-sentence requests, {args.rounds} rounds, device {args.device}, "
          f"torch threads {torch.get_num_threads()}, --max-batch-sentences {args.max_batch_sentences}")
    print(f"{'batching':10} {'sentences/s (median)':>22} {'rounds':>30}")
    for name, value in (("off", off), (f"on ({args.batch_wait_ms:g} ms)", on)):
        key = "off" if name == "off" else "on"
        print(f"{name:10} {value:22.1f} {' '.join(f'{r:.1f}' for r in rates[key]):>30}")
    print(f"on/off: {on / off:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "off": rates["off"], "on": rates["on"],
                                              "ratio": on / off}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
