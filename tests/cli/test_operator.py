"""The command line as people use it: options and positionals in any order, help on
every option, logging with -v/-q, shell completion. Commands run as processes
(``python -m smartnsq`` from the worktree root) unless the test is about the parser alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import closed_port

from smartnsq.cli import build_parser
from smartnsq.cli.devcluster import build_fault_parser
from smartnsq.cli.devcluster import build_parser as devcluster_parser

ROOT = Path(__file__).resolve().parents[2]
BOUND = 60.0


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if k not in ("SMARTNSQ_LOOKUPD", "DEVCLUSTER_ADMIN")}
    out["PYTHONPATH"] = str(ROOT)
    return out


async def smartnsq(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", *argv, cwd=ROOT, env=env(),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), BOUND)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_options_and_positionals_in_any_order(nsq_cluster: Any, tmp_path: Path) -> None:
    await nsq_cluster.create_topic("orders", partitions=2, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(3)))
    second.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(3, 5)))
    # the file after an option, an option between files, globals after the command
    code, out, err = await smartnsq("pub", "orders", "--key-field", "id", str(first),
                                    "--batch", "2", str(second), "--lookupd", lookupd)
    assert code == 0, err
    assert out.startswith("published 5 messages to orders")
    code, out, err = await smartnsq("lookup", "--json", "--lookupd", lookupd, "orders")
    assert code == 0, err
    assert json.loads(out)["topic"] == "orders"
    code, out, err = await smartnsq("pub", "--json", "orders", "--partition", "1", str(first),
                                    "--lookupd", lookupd)
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["messages"], summary["partitions"][0]["partition"]) == (3, 1)


async def test_demo_json_report() -> None:
    code, out, err = await smartnsq("demo", "--orders", "20", "--duration", "0", "--json",
                                    "--no-failover")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["consumed"] == report["total"] == 100
    assert len(report["partitions"]) == 4


def _actions(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest for a in action._choices_actions if a.help}
            for sub_name, sub in action.choices.items():
                assert sub_name in helped, f"{name} {sub_name} has no help line"
                out += _actions(sub, f"{name} {sub_name}")
        elif action.dest != "help":
            out.append((name, action))
    return out


def test_every_command_and_option_has_help() -> None:
    actions = (_actions(build_parser(), "smartnsq")
               + _actions(devcluster_parser("smartnsq dev-cluster"), "smartnsq dev-cluster")
               + _actions(build_fault_parser("smartnsq dev-cluster"), "fault"))
    missing = [f"{name} {action.option_strings or action.dest}" for name, action in actions
               if not action.help]
    assert not missing


async def test_verbose_logs_name_time_level_and_logger_quiet_hides_warnings() -> None:
    address = f"127.0.0.1:{closed_port()}"
    code, _, err = await smartnsq("lookup", "t", "--lookupd", address, "--timeout", "1", "-v")
    assert code == 1
    logged = [line for line in err.splitlines() if not line.startswith("smartnsq lookup:")]
    assert logged, err
    pattern = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (WARNING|INFO|DEBUG) smartnsq\.[a-z.]+: ")
    assert all(pattern.match(line) for line in logged), err
    assert any(" WARNING smartnsq.lookup: " in line for line in logged), err
    assert "DEBUG" not in err
    # without -v: the command's one line only
    code, _, err = await smartnsq("lookup", "t", "--lookupd", address, "--timeout", "1")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    # -vv: debug records too
    code, _, err = await smartnsq("-vv", "lookup", "t", "--lookupd", address, "--timeout", "1")
    assert code == 1 and " DEBUG smartnsq." in err


async def test_quiet_drops_the_commands_own_warnings(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("q", partitions=1, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    dead = f"127.0.0.1:{closed_port()}"
    nodes = f"{nsq_cluster.nsqd_http_addresses[0]},{dead}"
    code, _, err = await smartnsq("stats", "--nsqd-http", nodes, "--lookupd", lookupd)
    assert code == 0 and err.startswith("warning: "), err
    code, _, err = await smartnsq("stats", "-q", "--nsqd-http",
                                  f"{nsq_cluster.nsqd_http_addresses[0]},{dead}")
    assert code == 0 and err == ""


def _complete(script: str, words: list[str]) -> list[str]:
    """What the generated bash function offers for ``words`` (the last one being typed)."""
    driver = (script + "\nCOMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + ")\n"
              f"COMP_CWORD={len(words) - 1}\nCOMPREPLY=()\n_smartnsq\n"
              "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    done = subprocess.run(["bash", "-c", driver], capture_output=True, text=True,
                          timeout=BOUND, check=True)
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
async def test_completion_scripts() -> None:
    code, script, err = await smartnsq("completion", "bash")
    assert code == 0, err
    assert "complete -F _smartnsq smartnsq" in script
    assert {"demo", "dev-cluster", "lookup", "pub", "tail", "stats", "completion"} <= set(
        _complete(script, ["smartnsq", ""]))
    assert _complete(script, ["smartnsq", "--lookupd", "h:1", "lo"]) == ["lookup"]
    assert _complete(script, ["smartnsq", "pub", "t", "--sharding", ""]) == ["murmur3", "java"]
    assert "--key-field" in _complete(script, ["smartnsq", "pub", "t", "--k"])
    assert _complete(script, ["smartnsq", "dev-cluster", "fa"]) == ["fault"]
    actions = _complete(script, ["smartnsq", "dev-cluster", "fault", ""])
    assert {"kill", "status", "move-leader", "cut"} <= set(actions)
    assert _complete(script, ["smartnsq", "dev-cluster", "--mode", "c"]) == ["classic"]
    code, zsh, _ = await smartnsq("completion", "zsh")
    assert code == 0 and "bashcompinit" in zsh and "complete -F _smartnsq smartnsq" in zsh
    code, _, err = await smartnsq("completion", "fish")
    assert code == 2 and "invalid choice" in err


async def test_server_refusals_are_one_sentence_saying_what_to_change(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("plain", partitions=1, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, _, err = await smartnsq("pub", "plain", "--header", "a=b", "--lookupd", lookupd,
                                  stdin="x\n")
    assert code == 1 and err.strip().splitlines() == [
        "smartnsq pub: error: --header needs an ext topic, and 'plain' is not one (create a "
        "topic with ext enabled, or publish without headers)"]
    # SMARTNSQ_LOOKUPD in the environment does not clash with an explicit --nsqd
    node = nsq_cluster.nsqd_tcp_addresses[0]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "pub", "plain", "--nsqd", node, cwd=ROOT,
        env={**env(), "SMARTNSQ_LOOKUPD": lookupd}, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, raw = await asyncio.wait_for(proc.communicate(b"x\n"), BOUND)
    assert proc.returncode == 0, raw


def test_the_sharding_flag_offers_the_producers_schemes() -> None:
    """``pub --sharding`` offers the Producer's schemes, read from the one list
    (``smartnsq.model.sharding_schemes``, which imports nothing, so building the parser loads no
    client code); every name there has a router."""
    from smartnsq.cli import build_parser
    from smartnsq.model.sharding import SCHEMES, make_router

    parser = build_parser()
    pub = next(a for a in parser._subparsers._group_actions  # type: ignore[union-attr]
               if a.choices and "pub" in a.choices).choices["pub"]
    (sharding,) = [a for a in pub._actions if "--sharding" in a.option_strings]
    assert tuple(sharding.choices) == SCHEMES and sharding.default == SCHEMES[0]
    assert all(callable(make_router(name)) for name in SCHEMES)
