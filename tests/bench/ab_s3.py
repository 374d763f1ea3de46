"""What the S3 A/B scripts share (``ab_ranged_get.py``, ``ab_small_get.py``).

Not a test, never collected by pytest.  An A/B script names its variants
``kind:opt=value:...``; each round runs every variant once, in an order
rotated from round to round, against a fresh s3rver of the bench's own
(``BenchBase.s3_server``), after dropping the page cache.  Per run: the
seconds, the client's CPU (this process and its finished children: the
variants run in this process or as a child such as ``s5cmd``), the
server's CPU and its read+write system calls.  The subclass uploads its
objects (``upload``) and runs one variant (``fetch``) into a fresh
directory, and says in what units its figures are read (``units``: per
file, per GiB ...); the log lines and the report are the same for all.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    BenchBase,
    BenchError,
    add_run_arguments,
    add_server_arguments,
    children_cpu_seconds,
    comma_list,
    cpu_seconds,
    io_syscalls,
    log,
    table,
)


@dataclass(frozen=True)
class Sample:
    seconds: float
    client_cpu: float
    server_cpu: float
    server_syscalls: int


@dataclass(frozen=True)
class Units:
    """How a script reads its samples: a rate of ``amount`` per second
    (``rate``, e.g. "files/s"), CPU seconds divided by ``cpu_per`` (``cpu``,
    e.g. "ms/file"), the server's syscalls per MiB of ``mib``."""

    rate: str
    amount: float
    cpu: str
    cpu_per: float
    mib: float
    #: The first line of the report.
    title: str


def own_cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def parse_variant(text: str, kinds: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """``store:t=16:r=16`` -> ("store", {"t": "16", "r": "16"})."""
    kind, *options = text.split(":")
    if kind not in kinds:
        raise BenchError(f"unknown variant {text!r}: one of {', '.join(kinds)}")
    parsed: dict[str, str] = {}
    for option in options:
        name, sep, value = option.partition("=")
        if not sep:
            raise BenchError(f"variant {text!r}: option {option!r} is not NAME=VALUE")
        parsed[name] = value
    return kind, parsed


def add_ab_arguments(p: argparse.ArgumentParser, default_variants: str) -> None:
    """The options every S3 A/B script takes (its own come before)."""
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--variants",
        type=comma_list,
        default=comma_list(default_variants),
        help="the first is the reference of the ratios (see the module docstring)",
    )
    p.add_argument("--settle", type=float, default=1.0, help="seconds after drop_caches (1)")
    p.add_argument("--wait-idle", type=float, default=30.0, help="before each round (30)")
    p.add_argument("--py-spy", default=None, help=argparse.SUPPRESS)
    add_server_arguments(p)
    add_run_arguments(p, json_help=argparse.SUPPRESS)


class S3AB(BenchBase):
    """Rounds of variants against one s3rver; see the module docstring."""

    #: The variant kinds a subclass knows.
    KINDS: tuple[str, ...] = ()

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.variants = [(text, *parse_variant(text, self.KINDS)) for text in args.variants]
        self.samples: dict[str, list[Sample]] = {text: [] for text in args.variants}
        # Variants that run in this process use s3rver's credentials, as the children do.
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("AWS_")})

    def upload(self) -> None:
        raise NotImplementedError

    def fetch(self, kind: str, options: dict[str, str], dest: Path) -> None:
        """Run one variant into ``dest`` (empty); raise BenchError if it got less."""
        raise NotImplementedError

    def units(self) -> Units:
        raise NotImplementedError

    def describe(self, sample: Sample) -> str:
        u = self.units()
        return (
            f"{u.amount / sample.seconds:,.0f} {u.rate}, client {sample.client_cpu / u.cpu_per:.2f}"
            f" CPU {u.cpu}, server {sample.server_cpu / u.cpu_per:.2f} CPU {u.cpu},"
            f" {sample.server_syscalls / u.mib:.1f} syscalls/MiB"
        )

    def report(self) -> str:
        u = self.units()
        rows = []
        for text, samples in self.samples.items():
            if not samples:
                continue
            rows.append(
                [
                    text,
                    f"{statistics.median(u.amount / s.seconds for s in samples):,.0f}",
                    " ".join(f"{r:.2f}" for r in self.ratios(samples)),
                    f"{statistics.median(s.client_cpu for s in samples) / u.cpu_per:.2f}",
                    f"{statistics.median(s.server_cpu for s in samples) / u.cpu_per:.2f}",
                    f"{statistics.median(s.server_syscalls for s in samples) / u.mib:.1f}",
                ]
            )
        header = [
            "variant",
            u.rate,
            f"speed vs {self.args.variants[0]} by round",
            f"client CPU {u.cpu}",
            f"server CPU {u.cpu}",
            "server syscalls/MiB",
        ]
        lines = [f"{u.title}; medians of {self.args.rounds} rounds", ""]
        return "\n".join(lines + table(header, rows, left={0, 2}))

    def run(self) -> None:
        if os.geteuid() != 0:
            raise BenchError("run as root: the bench drops the page cache")
        with self.s3_server():
            self.upload()
            for round_no in range(self.args.rounds):
                log(f"round {round_no + 1} of {self.args.rounds}")
                self.wait_idle()
                shift = round_no % len(self.variants)
                for text, kind, options in self.variants[shift:] + self.variants[:shift]:
                    self.samples[text].append(self.measure(kind, options))
                    log(f"  {text}: {self.describe(self.samples[text][-1])}")

    def measure(self, kind: str, options: dict[str, str]) -> Sample:
        dest = self.work / "dest"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        self.drop_caches()
        server_pid = self.s3_server_proc.pid if self.s3_server_proc else None
        server0, calls0 = cpu_seconds(server_pid), io_syscalls(server_pid)
        client0 = own_cpu_seconds() + children_cpu_seconds()
        started = time.perf_counter()
        self.fetch(kind, options, dest)
        sample = Sample(
            time.perf_counter() - started,
            own_cpu_seconds() + children_cpu_seconds() - client0,
            cpu_seconds(server_pid) - server0,
            io_syscalls(server_pid) - calls0,
        )
        shutil.rmtree(dest, ignore_errors=True)
        return sample

    def ratios(self, samples: list[Sample]) -> list[float]:
        """Speed of each round's run against the first variant's in that round."""
        reference = self.samples.get(self.args.variants[0], [])
        return [ref.seconds / s.seconds for ref, s in zip(reference, samples, strict=False)]
