"""Web-single benchmark: pipeserve vs the in-process limit, a seed-style FastAPI app and a bare ASGI app.

Every server runs pinned to one core (--server-core), the load generator (wrk) to another (--client-core).
All servers stay up for the whole run and the measurements are interleaved (repeat -> concurrency ->
contender), so that a noisy minute hurts every contender alike; the table reports medians over repeats.

    make bench                      # or: .venv/bin/python bench/run.py [--quick]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
LUA = """
local f = io.open(os.getenv("BENCH_BODY"), "rb")
wrk.body = f:read("*a")
f:close()
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
"""


@dataclass
class Sample:
    model: str
    contender: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: url -> process group of every running server, so that idle ones can be frozen while another is measured.
PROCESS_GROUPS: dict[str, int] = {}


def only_running(url: str | None) -> None:
    """Freeze (SIGSTOP) every server but ``url`` (all of them for ``None``) and let ``url`` run (SIGCONT).

    Idle servers are not idle: LitServe's workers poll their queues (13% of a core, measured), others run
    timers. On the measured core that would be stolen from whichever server is under load.
    """
    for other, group in PROCESS_GROUPS.items():
        sent = signal.SIGCONT if other == url else signal.SIGSTOP
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, sent)
        for pid in _descendants(group):  # children in a session of their own (BentoML's worker)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sent)
    time.sleep(0.2)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@contextmanager
def server(name: str, command: list[str], env: dict[str, str], ready_path: str, log_dir: Path) -> Iterator[str]:
    port = free_port()
    command = [arg.replace("{port}", str(port)) for arg in command]
    env = {"PORT": str(port), **{key: value.replace("{port}", str(port)) for key, value in env.items()}}
    log = (log_dir / f"{name}.log").open("wb")
    process = subprocess.Popen(
        command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited: {(log_dir / f'{name}.log').read_text()[-2000:]}")
            try:
                if httpx.get(url + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become ready")
            time.sleep(0.3)
        PROCESS_GROUPS[url] = process.pid
        yield url
    finally:
        PROCESS_GROUPS.pop(url, None)
        strays = _descendants(process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGCONT)
            os.killpg(process.pid, signal.SIGTERM)
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for pid in strays:  # children outside the group that outlived their parent
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()


def wrk(
    url: str, body: Path, concurrency: int, duration_s: float, core: int | str, lua: Path, path: str = "/predict/label"
) -> tuple[float, float, float]:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: the make targets install it (make bench), or apt-get install wrk")
    command = [
        "taskset",
        "-c",
        str(core),
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{max(1, round(duration_s))}s",
        "--latency",
        "-s",
        str(lua),
        url + path,
    ]
    out = subprocess.run(
        command, env={**os.environ, "BENCH_BODY": str(body)}, capture_output=True, text=True, check=True
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} error responses at concurrency {concurrency}")
    return rps, _percentile(out, "50%"), _percentile(out, "99%")


def _percentile(out: str, label: str) -> float:
    match = re.search(rf"^\s+{re.escape(label)}\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no {label} latency in wrk output:\n{out}")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def in_process(model: str, body: Path, duration_s: float, core: int) -> tuple[float, float, float]:
    env = {**os.environ, "BENCH_MODEL": model, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        ["taskset", "-c", str(core), PY, "-m", "bench.apps.inprocess", str(body), str(duration_s)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["rps"], result["p50_ms"], result["p99_ms"]


def bodies(directory: Path) -> dict[str, Path]:
    iris = directory / "iris.json"
    iris.write_text(json.dumps({"data": [[5.1, 3.5, 1.4, 0.2]]}))
    imagenet = directory / "imagenet.json"
    cat = (ROOT / "examples" / "imagenet" / "samples" / "cat.jpg").read_bytes()
    imagenet.write_text(json.dumps({"data": base64.b64encode(cat).decode()}))
    return {"iris": iris, "imagenet": imagenet}


def contenders(model: str, core: int) -> dict[str, tuple[list[str], dict[str, str], str]]:
    pin = ["taskset", "-c", str(core)]
    uvicorn = [*pin, PY, "-m", "uvicorn", "--port", "{port}", "--no-access-log", "--log-level", "warning"]
    app_env = {"BENCH_MODEL": model, "PYTHONPATH": str(ROOT)}
    return {
        "pipeserve": (
            [*pin, PY, "-m", "pipeserve.cli.main", "serve", f"examples/{model}", "--port", "{port}"],
            {},
            "/health/ready",
        ),
        "seed-style FastAPI": ([*uvicorn, "bench.apps.seed_app:app"], app_env, "/health"),
        "bare ASGI": ([*uvicorn, "bench.apps.bare_app:app"], app_env, "/health"),
    }


def run(args: argparse.Namespace) -> list[Sample]:
    raw: list[Sample] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        lua = workdir / "post.lua"
        lua.write_text(LUA)
        body_files = bodies(workdir)
        log_dir = ROOT / "bench" / "results" / "raw"
        log_dir.mkdir(parents=True, exist_ok=True)
        for model in args.models:
            urls = {
                name: stack.enter_context(server(f"{model}-{name.split()[0]}", command, env, ready, log_dir))
                for name, (command, env, ready) in contenders(model, args.server_core).items()
            }
            for url in urls.values():  # warm every server up before measuring any
                only_running(url)
                wrk(url, body_files[model], 8, 2, args.client_core, lua)
            for repeat in range(args.repeats):
                only_running(None)
                limit = in_process(model, body_files[model], args.duration, args.server_core)
                for concurrency in args.concurrency:
                    raw.append(Sample(model, "in-process limit", concurrency, *limit))
                    for name, url in urls.items():
                        only_running(url)
                        rps, p50, p99 = wrk(url, body_files[model], concurrency, args.duration, args.client_core, lua)
                        raw.append(Sample(model, name, concurrency, rps, p50, p99))
                        print(
                            f"  [{repeat + 1}/{args.repeats}] {model:8} c={concurrency:<3} {name:20} "
                            f"{rps:9.1f} req/s  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms",
                            file=sys.stderr,
                        )
            stack.close()
    return raw


def summarize(raw: list[Sample]) -> list[Sample]:
    keys = sorted({(s.model, s.concurrency, s.contender) for s in raw}, key=lambda k: (k[0] != "iris", k[1]))
    order = ["in-process limit", "pipeserve", "seed-style FastAPI", "bare ASGI"]
    keys.sort(key=lambda k: (k[0] != "iris", k[1], order.index(k[2])))
    table = []
    for model, concurrency, contender in keys:
        group = [s for s in raw if (s.model, s.concurrency, s.contender) == (model, concurrency, contender)]
        table.append(
            Sample(
                model,
                contender,
                concurrency,
                statistics.median(s.rps for s in group),
                statistics.median(s.p50_ms for s in group),
                statistics.median(s.p99_ms for s in group),
            )
        )
    return table


def checks(table: list[Sample]) -> list[tuple[str, bool, str]]:
    def get(model: str, contender: str, concurrency: int) -> Sample | None:
        return next(
            (s for s in table if (s.model, s.contender, s.concurrency) == (model, contender, concurrency)), None
        )

    results = []
    for concurrency in sorted({s.concurrency for s in table if s.model == "imagenet"}):
        ours, seed = get("imagenet", "pipeserve", concurrency), get("imagenet", "seed-style FastAPI", concurrency)
        if ours and seed:
            results.append(
                (
                    f"imagenet c={concurrency}: pipeserve req/s >= seed-style",
                    ours.rps >= seed.rps,
                    f"{ours.rps:.1f} vs {seed.rps:.1f} ({ours.rps / seed.rps:.2f}x)",
                )
            )
    ours, limit = get("imagenet", "pipeserve", 1), get("imagenet", "in-process limit", 1)
    if ours and limit:
        gap = ours.p50_ms - limit.p50_ms
        results.append(
            (
                "imagenet c=1: pipeserve p50 within 1.5 ms of the in-process limit",
                gap <= 1.5,
                f"{ours.p50_ms:.2f} ms vs {limit.p50_ms:.2f} ms ({gap:+.2f} ms)",
            )
        )
    ours, seed, bare = get("iris", "pipeserve", 32), get("iris", "seed-style FastAPI", 32), get("iris", "bare ASGI", 32)
    if ours and seed and bare:
        results.append(
            (
                "iris c=32: pipeserve >= 3x seed-style req/s",
                ours.rps >= 3 * seed.rps,
                f"{ours.rps / seed.rps:.2f}x ({ours.rps:.0f} vs {seed.rps:.0f})",
            )
        )
        results.append(
            (
                "iris c=32: pipeserve >= 60% of bare ASGI req/s",
                ours.rps >= 0.6 * bare.rps,
                f"{ours.rps / bare.rps:.0%} ({ours.rps:.0f} vs {bare.rps:.0f})",
            )
        )
    return results


def markdown(table: list[Sample], results: list[tuple[str, bool, str]], args: argparse.Namespace) -> str:
    lines = [
        "| model | concurrency | contender | req/s | p50 ms | p99 ms | req/s vs seed-style | req/s vs bare ASGI |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for s in table:
        seed = next(
            t for t in table if (t.model, t.concurrency, t.contender) == (s.model, s.concurrency, "seed-style FastAPI")
        )
        bare = next(t for t in table if (t.model, t.concurrency, t.contender) == (s.model, s.concurrency, "bare ASGI"))
        lines.append(
            f"| {s.model} | {s.concurrency} | {s.contender} | {s.rps:,.0f} | {s.p50_ms:.2f} | {s.p99_ms:.2f} "
            f"| {s.rps / seed.rps:.2f}x | {s.rps / bare.rps:.0%} |"
        )
    lines += ["", "| target | result | measured |", "|---|---|---|"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in results]
    header = (
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} ({os.cpu_count()} cores, "
        f"{platform.processor() or platform.machine()}), Python {platform.python_version()}; servers pinned to "
        f"core {args.server_core}, wrk to core {args.client_core}; {args.duration:g} s per point, median of "
        f"{args.repeats} interleaved repeats. The in-process limit is measured once per repeat (no concurrency)."
    )
    return header + "\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["iris", "imagenet"], choices=["iris", "imagenet"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="4 s per point, 1 repeat (a smoke run)")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks" / "web_single.md")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.repeats = 4.0, 1
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install wrk (make bench does it)")
    raw = run(args)
    table = summarize(raw)
    results = checks(table)
    text = markdown(table, results, args)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(f"# Web-single benchmark\n\nCommand: `{' '.join(['python', *sys.argv])}`\n\n{text}")
    json_path = ROOT / "bench" / "results" / "web_single.json"
    json_path.write_text(json.dumps([asdict(s) for s in raw], indent=1))


if __name__ == "__main__":
    main()
