"""The Kubernetes manifests and the image: every document parses and has
what a node daemon on GPU nodes needs (no cluster needed)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tierfs.cli import main

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents(name: str) -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))
    assert docs and all(isinstance(doc, dict) and doc.get("kind") for doc in docs)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_the_daemonset_tolerates_taints_has_resources_probes_metrics_and_propagation() -> None:
    docs = documents("daemonset.yaml")
    pod = by_kind(docs, "DaemonSet")["spec"]["template"]
    spec = pod["spec"]
    assert {"operator": "Exists"} in spec["tolerations"]
    (container,) = spec["containers"]
    assert "-o allow_other" in container["command"][-1]
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    assert container["livenessProbe"]["exec"]["command"][:2] == ["tierfs", "status"]
    assert container["livenessProbe"]["failureThreshold"] >= 3
    assert container["lifecycle"]["preStop"]["exec"]["command"][:2] == ["tierfs", "umount"]
    (port,) = container["ports"]
    assert port["containerPort"] != 9567  # JuiceFS's default metrics port
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/mnt/data"]["mountPropagation"] == "Bidirectional"

    config_text = by_kind(docs, "ConfigMap")["data"]["tierfs.toml"]
    listen = tomllib.loads(config_text)["metrics"]["listen"]
    assert listen.rsplit(":", 1)[1] == str(port["containerPort"])


def test_the_daemonsets_config_passes_an_offline_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "tierfs.toml"
    config.write_text(by_kind(documents("daemonset.yaml"), "ConfigMap")["data"]["tierfs.toml"])
    assert main(["policy", "check", "--offline", str(config)]) == 0
    assert capsys.readouterr().out.startswith("ok")


def test_the_example_job_preloads_in_an_init_container_and_trains_as_a_user() -> None:
    spec = by_kind(documents("job-example.yaml"), "Job")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["command"][:2] == ["tierfs", "preload"] and "--ready-fraction" in init["command"]
    mounts = {m["mountPath"] for m in init["volumeMounts"]}
    assert {"/mnt/data", "/run/tierfs"} <= mounts
    (train,) = spec["containers"]
    assert train["securityContext"]["runAsNonRoot"] is True
    assert init["securityContext"]["runAsNonRoot"] is True  # the socket serves every user
    # The sampler and tierfs.client reach the daemon through /run/tierfs, at
    # the host's path; without it the sampler is always off in a pod.
    train_mounts = {m["mountPath"]: m for m in train["volumeMounts"]}
    assert train_mounts["/run/tierfs"]["readOnly"] is True
    assert "/mnt/data" in train_mounts
    assert "--cancel-tag train-example" in train["command"][-1]  # no epilog in Kubernetes
    assert "--tag" in init["command"] and "train-example" in init["command"]


def test_the_default_mount_point_is_one_everywhere() -> None:
    """The README, fstab line, systemd unit, Slurm scripts and Kubernetes
    manifests agree on /mnt/data: a prolog preloading another mount point
    would silently preload nothing."""
    root = DEPLOY.parent
    texts = {
        "slurm/prolog.sh": (DEPLOY / "slurm" / "prolog.sh").read_text(),
        "slurm/epilog.sh": (DEPLOY / "slurm" / "epilog.sh").read_text(),
        "systemd": (root / "systemd" / "tierfs@.service").read_text(),
        "daemonset": (DEPLOY / "kubernetes" / "daemonset.yaml").read_text(),
        "README": (root / "README.md").read_text(),
    }
    for name, text in texts.items():
        assert "/mnt/data" in text, name
        assert not re.findall(r"/mnt/(main|tierfs)\b", text), name
    assert "TIERFS_MOUNT:-/mnt/data}" in texts["slurm/prolog.sh"]
    assert "TIERFS_MOUNT:-/mnt/data}" in texts["slurm/epilog.sh"]


def test_the_image_is_debian_12_with_fuse3_and_the_package() -> None:
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert re.findall(r"^FROM debian:12", text, re.M)
    assert "fuse3" in text and "pip install" in text and "mount.fuse.tierfs" in text
